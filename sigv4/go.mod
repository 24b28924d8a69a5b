module github.com/failover-go/failover/sigv4

go 1.26.0

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/failover-go/failover v0.0.0-00010101000000-000000000000
)

require (
	github.com/VictoriaMetrics/metrics v1.45.0 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/failsafe-go/failsafe-go v0.9.8 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/tidwall/gjson v1.20.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.0 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
)
