package failover

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/circuit"
)

// upstream is the configuration and live state of one upstream.
type upstream struct {
	cfg     Upstream // as configured, for probes
	index   int
	name    string
	baseURL string // redacted: scheme, host and path only
	scheme  string
	host    string // as configured, for the rewritten URL and Host header
	path    string // decoded base path, no trailing slash (before {deployment} when deployed)
	rawPath string // escaped base path, no trailing slash (before {deployment} when deployed)
	header  http.Header
	headers []headerField // header's fields in a slice, sorted by key: what each request reads (rewrite)
	lens    uint64        // bit n set: a key of headers or keyNames is n bytes long (n < 64), or, bit 63, 63 or more (sets)
	models  modelMap      // Upstream.Models

	// Upstream.Keys (keys.go): each key and its state, the names their
	// Headers set, and the round-robin's count (plan.pickKey).
	keys     []*key
	keyNames []string
	rr       atomic.Uint32

	// With a {deployment} segment in BaseURL's path (deployed), what
	// follows that segment, decoded and escaped.
	deployed          bool
	suffix, rawSuffix string

	// Upstream.Query: its names, and its pairs encoded (withQuery).
	queryNames []string
	rawQuery   string

	// The policy in effect (policy.go): Upstream.Breaker over
	// Config.Breaker with the defaults filled in, and the Timeouts in
	// effect (timeoutsOf; 0: no bound), whose Headers is timeout.
	breaker  BreakerConfig
	timeouts Timeouts
	timeout  time.Duration

	circuit  *circuit.Circuit
	timedOut atomic.Int64 // mono.Time of its last attempt that timed out (AttemptTimeout)
	cd       cooldown
	window   window
	live     liveness
	latency  peakEWMA // for LeastLatency
	headroom headroomState
	fleet    fleetState // with Config.Shared
	auth     authState
	m        upstreamMetrics
	usage    usageState

	// The recent figures of each feature's window: Degraded's (which the
	// routers read too), Hang's and Hedge's. Features with the same
	// window share one.
	recent, hangRecent, hedgeRecent *recent
}

// newUpstream checks and parses the i-th upstream's config.
func newUpstream(i int, uc Upstream) (*upstream, error) {
	field := func(f string) string { return fmt.Sprintf("Upstreams[%d].%s", i, f) }
	base, err := url.Parse(uc.BaseURL)
	switch {
	case uc.BaseURL == "":
		return nil, configError(field("BaseURL"), "is empty")
	case err != nil:
		return nil, configError(field("BaseURL"), "is not a URL") // err may quote the URL
	case base.Scheme != "http" && base.Scheme != "https":
		return nil, configError(field("BaseURL"), "must be an absolute http or https URL")
	case base.Host == "" || base.Hostname() == "":
		return nil, configError(field("BaseURL"), "has no host")
	case !validPort(base.Port()):
		return nil, configError(field("BaseURL"), "has a port outside 1-65535")
	case base.User != nil:
		return nil, configError(field("BaseURL"), "must not carry user info: put credentials in Header")
	case base.RawQuery != "" || base.ForceQuery:
		return nil, configError(field("BaseURL"), "must not carry a query: put parameters in Query and credentials in Header")
	case base.Fragment != "":
		return nil, configError(field("BaseURL"), "must not carry a fragment")
	case hasDotSegment(base.Path):
		return nil, configError(field("BaseURL"), "must not contain . or .. path segments")
	}
	name := uc.Name
	if name == "" {
		name = base.Host
	}
	if strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return nil, configError(field("Name"), "must not contain control characters")
	}
	switch {
	case uc.Weight < 0 || uc.Weight != uc.Weight:
		return nil, configError(field("Weight"), "must not be negative")
	case !price(uc.Cost.Input) || !price(uc.Cost.Output) || !price(uc.Cost.CachedInput) || !price(uc.Cost.CacheWrite):
		return nil, configError(field("Cost"), "prices must be finite, not negative and at most 1e100")
	}
	if err := uc.validatePolicy(i); err != nil {
		return nil, err
	}
	if err := checkAuthorizer(field("Authorizer"), uc.Authorizer); err != nil {
		return nil, err
	}
	if err := uc.Prefill.validate(field); err != nil {
		return nil, err
	}
	if err := checkHeader(field("Header"), uc.Header); err != nil {
		return nil, err
	}
	u := &upstream{
		cfg:     uc,
		index:   i,
		name:    name,
		baseURL: base.Scheme + "://" + base.Host + base.EscapedPath(),
		scheme:  base.Scheme,
		host:    base.Host,
		path:    base.Path,
		rawPath: base.EscapedPath(),
		header:  http.Header{},
	}
	if strings.HasSuffix(u.rawPath, "/") { // a literal slash, not %2F
		u.rawPath = u.rawPath[:len(u.rawPath)-1]
		u.path = strings.TrimSuffix(u.path, "/")
	}
	if strings.ContainsAny(u.path, "{}") {
		if !u.splitDeployment(base) {
			return nil, configError(field("BaseURL"), "may hold {deployment} once, as a whole path segment, and no other { or }")
		}
		u.baseURL = u.scheme + "://" + u.host + u.rawPath + "/{deployment}" + u.rawSuffix
	}
	for _, k := range slices.Sorted(maps.Keys(uc.Query)) {
		if k == "" {
			return nil, configError(field("Query"), "has an empty parameter name")
		}
		if j := slices.IndexFunc(u.queryNames, func(n string) bool { return strings.EqualFold(n, k) }); j >= 0 {
			return nil, configError(field("Query"), fmt.Sprintf("names %q and %q: one parameter in two cases", u.queryNames[j], k))
		}
		u.queryNames = append(u.queryNames, k)
	}
	u.rawQuery = url.Values(uc.Query).Encode()
	for k, vs := range uc.Header {
		u.header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	for _, k := range slices.Sorted(maps.Keys(u.header)) {
		u.headers = append(u.headers, headerField{k, u.header[k]})
		u.lens |= lenBit(len(k))
	}
	if err := u.newKeys(i, uc.Keys); err != nil {
		return nil, err
	}
	if len(uc.Models) > 0 {
		if err := modelMap(uc.Models).validate(field("Models")); err != nil {
			return nil, err
		}
		u.models = maps.Clone(uc.Models)
		if u.deployed {
			for _, k := range slices.Sorted(maps.Keys(u.models)) {
				if v := u.models[k]; v != "*" && !pathSegment(v) {
					return nil, configError(field("Models"), "maps "+strconv.Quote(k)+" to "+strconv.Quote(v)+": not a path segment for {deployment}")
				}
			}
		}
	}
	return u, nil
}

// splitDeployment sets u's base path to what precedes the {deployment}
// segment of base's path, and its suffix to what follows, from u.path
// and the escaped path that base was written with (literal or escaped
// braces alike). It reports false unless the path has exactly one such
// segment and no other brace.
func (u *upstream) splitDeployment(base *url.URL) bool {
	raw := strings.TrimSuffix(cmp.Or(base.RawPath, base.EscapedPath()), "/")
	n := 0
	for i := 0; i < len(raw); {
		if raw[i] != '/' {
			i++
			continue
		}
		end := strings.IndexByte(raw[i+1:], '/')
		if end < 0 {
			end = len(raw)
		} else {
			end += i + 1
		}
		if seg, err := url.PathUnescape(raw[i+1 : end]); err == nil && seg == "{deployment}" {
			n++
			u.rawPath, u.rawSuffix = raw[:i], raw[end:]
		}
		i = end
	}
	if n != 1 {
		return false
	}
	var err error
	if u.path, err = url.PathUnescape(u.rawPath); err != nil {
		return false
	}
	if u.suffix, err = url.PathUnescape(u.rawSuffix); err != nil {
		return false
	}
	if strings.ContainsAny(u.path, "{}") || strings.ContainsAny(u.suffix, "{}") {
		return false
	}
	// Escaped as net/url would, for the paths that rewrite builds.
	u.rawPath = (&url.URL{Path: u.path, RawPath: u.rawPath}).EscapedPath()
	u.rawSuffix = (&url.URL{Path: u.suffix, RawPath: u.rawSuffix}).EscapedPath()
	u.deployed = true
	return true
}

// pathSegment reports whether s may fill a {deployment} segment, once
// path-escaped: not empty, not a dot segment, and no slash, backslash or
// control character, which would make it another path than one segment.
func pathSegment(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsFunc(s, func(r rune) bool {
		return r == '/' || r == '\\' || r < ' ' || r == 0x7f
	})
}

// validPort reports whether p, a URL's port, is empty (the scheme's) or
// one a connection can have.
func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return p == "" || err == nil && n > 0
}

// checkHeader checks h, an Upstream's or a Key's Header, named field:
// valid names, and values net/http sends.
func checkHeader(field string, h http.Header) error {
	for k, vs := range h {
		if !validHeaderName(k) {
			return configError(field, fmt.Sprintf("has an invalid header name %q", k))
		}
		for _, v := range vs {
			if strings.ContainsFunc(v, headerControl) {
				// Never quote the value: it is likely a key.
				return configError(field, fmt.Sprintf("has an invalid value for %q", k))
			}
		}
	}
	return nil
}

// headerControl reports whether r is a control character that net/http
// refuses in a header value: any but HT.
func headerControl(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }

// finite reports whether x is neither NaN nor infinite.
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// maxPrice is the largest price New takes: an answer's cost at it (at
// most maxTokens of each figure) and the sum of any number of answers'
// stay finite, where a price near the largest float64 made them +Inf,
// which UpstreamHealth's JSON cannot encode and Score took for free.
const maxPrice = 1e100

// price reports whether x is a valid price: finite, not negative and at
// most maxPrice.
func price(x float64) bool { return finite(x) && x >= 0 && x <= maxPrice }

// headerField is a header's key, canonical, and its values.
type headerField struct {
	key    string
	values []string
}

// sets reports whether u's Header, or one of its Keys', sets the caller's
// header k, in any spelling: net/http would send a non-canonical key as a
// second header.
func (u *upstream) sets(k string) bool {
	if u.lens&lenBit(len(k)) == 0 {
		return false // no key of its is as long: most of the caller's headers
	}
	for i := range u.headers {
		if h := u.headers[i].key; len(h) == len(k) && (h == k || equalFoldASCII(h, k)) {
			return true
		}
	}
	return len(u.keyNames) > 0 && u.setsKey(k)
}

// lenBit is the bit of upstream.lens for a key n bytes long.
func lenBit(n int) uint64 { return 1 << min(n, 63) }

// noModel is the model that admission reads for a request that names
// none and was not addressed to a {deployment} upstream (see
// call.admitting): every other upstream serves it as it is, but a
// deployed one has nothing to fill its deployment with. The empty model
// is any model: Health's. (A body whose model is "\x00" reads as naming
// none.)
const noModel = "\x00"

// serves reports whether u serves model ("" serves everywhere): its
// Models map it, and when u is deployed, to a path segment.
func (u *upstream) serves(model string) bool {
	switch {
	case model == noModel:
		return !u.deployed
	case model == "" || len(u.models) == 0 && !u.deployed:
		return true
	}
	target, ok := u.models.lookup(model)
	return ok && (!u.deployed || pathSegment(target))
}

// withQuery returns raw, a request's raw query, with u's Query in place
// of the pairs of the same names in any case, as the credential rule
// compares names: a server that folds case would otherwise see both.
func (u *upstream) withQuery(raw string) string {
	if len(u.queryNames) == 0 {
		return raw
	}
	raw = stripQuery(raw, func(pair string) bool {
		name := queryName(pair)
		return slices.ContainsFunc(u.queryNames, func(k string) bool { return strings.EqualFold(k, name) })
	})
	switch {
	case u.rawQuery == "":
		return raw
	case raw == "":
		return u.rawQuery
	}
	return raw + "&" + u.rawQuery
}
