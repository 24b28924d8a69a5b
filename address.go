package failover

import (
	"cmp"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"unsafe"
)

// hostKey returns host lowercased and without the scheme's default port, so
// that every spelling of one authority compares equal.
func hostKey(scheme, host string) string {
	h, port := splitHostPort(host)
	if port == defaultPort(scheme) {
		port = ""
	}
	h = strings.ToLower(h)
	if port == "" {
		return h
	}
	return h + ":" + port
}

// splitHostPort splits an authority into host and port. An IPv6 host keeps
// its brackets, so that "[::1]:8080" and "[::1:8080]" stay apart.
func splitHostPort(host string) (h, port string) {
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return host, ""
		}
		h, rest := host[:end+1], host[end+1:]
		if p, ok := strings.CutPrefix(rest, ":"); ok {
			return h, p
		}
		return h, ""
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		return host[:i], host[i+1:]
	}
	return host, ""
}

func defaultPort(scheme string) string {
	switch strings.ToLower(scheme) {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return ""
}

// hasDotSegment reports whether p has a "." or ".." segment, which would
// let a request climb out of a base path once the upstream resolves it. A
// backslash separates segments too, as some servers read it.
func hasDotSegment(p string) bool {
	if strings.IndexByte(p, '.') < 0 {
		return false
	}
	for p != "" {
		i := strings.IndexAny(p, `/\`)
		seg := p
		if i >= 0 {
			seg, p = p[:i], p[i+1:]
		} else {
			p = ""
		}
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// route returns the upstream that u is addressed to (the longest matching
// base path wins), or nil, and the rest of the path after its base path,
// decoded and escaped (see request.escapedRest). Both must lie under the
// base path, so that an encoded slash cannot pass for a path segment.
// spelled reports that u spells scheme and host as the BaseURL does.
func (t *Transport) route(u *url.URL) (up *upstream, rest, rawRest string, spelled bool) {
	if u.Opaque != "" || u.Host == "" {
		return nil, "", "", false
	}
	ups, sp := t.upstreamsAt(u.Scheme, u.Host)
	if len(ups) == 0 {
		return nil, "", "", false
	}
	// The escaped path is made only when u has a RawPath or the base
	// path needs escaping or has a {deployment}; otherwise it is Path's
	// escaping.
	var raw string
	escaped := false
	n, rawN := 0, 0
	for i, c := range ups { // the longest base path first
		if (sp == nil && !equalFoldASCII(u.Scheme, c.scheme)) || !underBase(u.Path, c.path) {
			continue
		}
		n, rawN = len(c.path), len(c.rawPath)
		if u.RawPath != "" || c.rawPath != c.path || c.deployed {
			if !escaped {
				raw, escaped = escapedPath(u), true
			}
			var ok bool
			if n, rawN, ok = c.under(u.Path, raw); !ok {
				continue
			}
		}
		up = c
		if sp != nil {
			spelled = sp.spells(i)
		} else {
			spelled = u.Scheme == c.scheme && u.Host == c.host
		}
		break
	}
	if up == nil || hasDotSegment(u.Path) {
		return nil, "", "", false
	}
	if escaped {
		rawRest = raw[rawN:]
	}
	return up, u.Path[n:], rawRest, spelled
}

// under reports whether path, decoded, and raw, its escaping, lie under
// u's base path, and how long that base path is in each: for a deployed
// upstream, with the caller's deployment, one path segment (decoded
// alike in both), and the suffix.
func (u *upstream) under(path, raw string) (n, rawN int, ok bool) {
	if !underBase(path, u.path) || !underBase(raw, u.rawPath) {
		return 0, 0, false
	}
	if !u.deployed {
		return len(u.path), len(u.rawPath), true
	}
	if len(raw) == len(u.rawPath) || len(path) == len(u.path) {
		return 0, 0, false // no deployment
	}
	rawSeg := raw[len(u.rawPath)+1:]
	if i := strings.IndexByte(rawSeg, '/'); i >= 0 {
		rawSeg = rawSeg[:i]
	}
	seg, err := url.PathUnescape(rawSeg)
	if err != nil || !pathSegment(seg) {
		return 0, 0, false
	}
	n, rawN = len(u.path)+1, len(u.rawPath)+1
	if !strings.HasPrefix(path[n:], seg) || !underBase(path[n+len(seg):], u.suffix) || !underBase(raw[rawN+len(rawSeg):], u.rawSuffix) {
		return 0, 0, false
	}
	return n + len(seg) + len(u.suffix), rawN + len(rawSeg) + len(u.rawSuffix), true
}

// deployment returns the deployment that path, the caller's decoded
// path, addresses at u, a deployed upstream, with rest the part that
// follows u's suffix.
func (u *upstream) deployment(path, rest string) string {
	if len(path) < len(u.path)+1+len(u.suffix)+len(rest) {
		return ""
	}
	return path[len(u.path)+1 : len(path)-len(rest)-len(u.suffix)]
}

// span is how much of a request's path u's base path takes at the
// least, to put the longest first: a deployment takes a byte and its
// slash.
func (u *upstream) span() int {
	if u.deployed {
		return len(u.path) + 2 + len(u.suffix)
	}
	return len(u.path)
}

// upstreamsAt returns the upstreams on scheme and host's host, the longest
// base path first (hosts): at once for a host spelled as an upstream's
// BaseURL spells it (the usual request, made from that BaseURL), with
// that spelling, else by its key, with a nil spelling.
func (t *Transport) upstreamsAt(scheme, host string) ([]*upstream, *spelling) {
	for i := range t.spelled {
		if e := &t.spelled[i]; e.host == host && e.scheme == scheme {
			return e.ups, e
		}
	}
	var buf [64]byte
	return t.hosts[hostKeyIn(buf[:0], scheme, host)], nil
}

// spelling is a scheme and host as an upstream's BaseURL spells them, and
// the upstreams on that host with that scheme (see Transport.spelled).
type spelling struct {
	scheme, host string
	ups          []*upstream
	exact        uint64 // bit i: ups[i]'s BaseURL spells scheme and host so too (i < 64)
}

// spells reports whether ups[i]'s BaseURL spells e's scheme and host.
func (e *spelling) spells(i int) bool { return i < 64 && e.exact&(1<<i) != 0 }

// maxSpellings bounds Transport.spelled, so that a request to a host spelled
// otherwise costs the same however many upstreams there are.
const maxSpellings = 4

// spellings is Transport.spelled for ups and their hosts map: the first
// maxSpellings distinct spellings of the upstreams' schemes and hosts.
func spellings(ups []*upstream, hosts map[string][]*upstream) []spelling {
	var out []spelling
	for _, u := range ups {
		if len(out) == maxSpellings {
			break
		}
		if !slices.ContainsFunc(out, func(s spelling) bool { return s.scheme == u.scheme && s.host == u.host }) {
			var buf [64]byte
			e := spelling{scheme: u.scheme, host: u.host}
			for _, v := range hosts[hostKeyIn(buf[:0], u.scheme, u.host)] { // the longest base path first
				if !equalFoldASCII(v.scheme, u.scheme) {
					continue
				}
				if v.scheme == u.scheme && v.host == u.host && len(e.ups) < 64 {
					e.exact |= 1 << len(e.ups)
				}
				e.ups = append(e.ups, v)
			}
			out = append(out, e)
		}
	}
	return out
}

// hostKeyIn is hostKey(scheme, host) with ASCII letters lowered, written
// to b only when host is not lower case already. Its result may share b's
// bytes: it is for a map lookup.
func hostKeyIn(b []byte, scheme, host string) string {
	h, port := splitHostPort(host)
	if port == "" || port == defaultPort(scheme) {
		host = h
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; 'A' <= c && c <= 'Z' {
			b = append(b, host...)
			for j := i; j < len(b); j++ {
				if c := b[j]; 'A' <= c && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return unsafe.String(unsafe.SliceData(b), len(b))
		}
	}
	return host
}

// equalFoldASCII reports whether a and b are equal with their ASCII
// letters in either case.
func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if x, y := a[i], b[i]; x != y && (x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z') {
			return false
		}
	}
	return true
}

// hostMap is Transport.hosts for ups: the upstreams on each host (by
// hostKey), the longest base path first, in their configured order among
// equals.
func hostMap(ups []*upstream) map[string][]*upstream {
	m := make(map[string][]*upstream)
	for _, u := range ups {
		var buf [64]byte
		k := strings.Clone(hostKeyIn(buf[:0], u.scheme, u.host))
		m[k] = append(m[k], u)
	}
	for _, list := range m {
		slices.SortStableFunc(list, func(a, b *upstream) int { return cmp.Compare(b.span(), a.span()) })
	}
	return m
}

// escapedPath is u.EscapedPath() without its work for the usual path: one
// with no RawPath and no byte that needs escaping is its own escaping.
func escapedPath(u *url.URL) string {
	if u.RawPath == "" && pathSafe(u.Path) {
		return u.Path
	}
	return u.EscapedPath()
}

// pathSafe reports whether no byte of p needs escaping in a URL's path, as
// net/url escapes one: letters, digits and -._~$&+,/:;=@.
func pathSafe(p string) bool {
	for i := 0; i < len(p); i++ {
		if !pathSafeByte[p[i]] {
			return false
		}
	}
	return true
}

var pathSafeByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~$&+,/:;=@", byte(c)) >= 0
	}
	return t
}()

// address is route for a request the caller sent (not a redirect hop),
// with Config.Unrouted's fallback: under UnroutedFirst, a URL whose scheme
// and host no upstream has is addressed to the first when its path lies
// under that upstream's base path. (A URL on an upstream's own host is
// that upstream's business: its credentials must not go to the first.)
func (t *Transport) address(u *url.URL) (up *upstream, rest, rawRest string, spelled bool) {
	up, rest, rawRest, spelled = t.route(u)
	if up != nil || t.unroutedPolicy != UnroutedFirst || u.Opaque != "" || u.Host == "" || hasDotSegment(u.Path) || t.reachesUpstream(u) || t.maybeIDN(u.Host) {
		return up, rest, rawRest, spelled
	}
	first, raw := t.upstreams[0], escapedPath(u)
	n, rawN, ok := first.under(u.Path, raw)
	if !ok {
		return nil, "", "", false
	}
	return first, u.Path[n:], raw[rawN:], false // (an escaped rest is a rest's escaping: see escapedRest)
}

// hostOfUpstream reports whether some upstream has u's scheme and host.
func (t *Transport) hostOfUpstream(u *url.URL) bool {
	ups, sp := t.upstreamsAt(u.Scheme, u.Host)
	for _, c := range ups {
		if sp != nil || equalFoldASCII(u.Scheme, c.scheme) {
			return true
		}
	}
	return false
}

// reachesUpstream reports whether a client connects for u to the host and
// port of some upstream, however u spells them (authorityKey): for a URL
// on an upstream's own scheme and host (hostOfUpstream) too.
func (t *Transport) reachesUpstream(u *url.URL) bool {
	return t.authorities[authorityKey(u.Scheme, u.Host)]
}

// authorityKey is the host and port a client connects to for scheme and
// host, however spelled: "b.test.:08080" is b.test:8080, as net/http dials
// it. Routing keeps to hostKey; address reads this so that UnroutedFirst
// sends no other upstream's credentials to the first.
func authorityKey(scheme, host string) string {
	h, port := splitHostPort(host)
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		// An IP literal in any of its forms is the address it is; a
		// zone matters only to an address that needs one.
		if a = a.Unmap(); !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() && !a.IsInterfaceLocalMulticast() {
			a = a.WithZone("")
		}
		h = a.String()
		if a.Is6() {
			h = "[" + h + "]"
		}
	} else {
		h = strings.TrimRight(h, ".")
	}
	if port != "" {
		if port = strings.TrimLeft(port, "0"); port == "" {
			port = "0"
		}
	}
	if port == "" {
		port = defaultPort(scheme)
	}
	return strings.ToLower(h) + ":" + port
}

// asciiHost reports whether host is all ASCII. net/http dials a host
// name with other bytes as IDNA maps it ("\uff42.test", a fullwidth b, is
// b.test), which authorityKey does not model: it may be any upstream's
// authority, so UnroutedFirst sends no credentials for it to the first.
func asciiHost(host string) bool {
	for i := 0; i < len(host); i++ {
		if host[i] >= 0x80 {
			return false
		}
	}
	return true
}

// maybeIDN reports whether host may be an upstream's authority by IDNA,
// which net/http dials a host name beyond ASCII by: it is beyond ASCII
// itself, or it has an ACE label ("xn--") while some upstream's host is
// beyond ASCII (bücher.test is dialed as xn--bcher-kva.test).
func (t *Transport) maybeIDN(host string) bool {
	if !asciiHost(host) {
		return true
	}
	return t.idnUpstream && hasACELabel(host)
}

// hasACELabel reports whether host has a label that begins "xn--", in any
// case: an IDNA name's ASCII form.
func hasACELabel(host string) bool {
	for label := range strings.SplitSeq(host, ".") {
		if len(label) >= 4 && strings.EqualFold(label[:4], "xn--") {
			return true
		}
	}
	return false
}

// authorityMap is Transport.authorities for ups.
func authorityMap(ups []*upstream) map[string]bool {
	m := make(map[string]bool, len(ups))
	for _, u := range ups {
		m[authorityKey(u.scheme, u.host)] = true
	}
	return m
}

// idnUpstream reports whether some upstream's host is beyond ASCII
// (Transport.idnUpstream).
func idnUpstream(ups []*upstream) bool {
	return slices.ContainsFunc(ups, func(u *upstream) bool { return !asciiHost(u.host) })
}

// checkDeployments refuses a {deployment} upstream whose base path before
// the placeholder is another upstream's whole base path on the same
// scheme, host and port: every request addressed to the one lies under
// the other as well ("/v1/chat/completions" reads as deployment "chat"),
// and no route can tell which the caller meant. A deployed BaseURL under
// a longer path than the other's stays: the longer base path wins.
func checkDeployments(ups []*upstream) error {
	for i, u := range ups {
		if !u.deployed {
			continue
		}
		for j, v := range ups {
			if v.deployed || u.path != v.path || !equalFoldASCII(u.scheme, v.scheme) || hostKey(u.scheme, u.host) != hostKey(v.scheme, v.host) {
				continue
			}
			return configError(fmt.Sprintf("Upstreams[%d].BaseURL", i), fmt.Sprintf("puts {deployment} right under Upstreams[%d].BaseURL: a request there may be addressed to either; give one a longer path", j))
		}
	}
	return nil
}

// underBase reports whether path is base or lies under it.
func underBase(path, base string) bool {
	return strings.HasPrefix(path, base) && (len(path) == len(base) || path[len(base)] == '/')
}
