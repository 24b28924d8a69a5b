module github.com/failover-go/failover

go 1.26

require (
	github.com/VictoriaMetrics/metrics v1.45.0
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/hashicorp/go-retryablehttp v0.7.8
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
)
