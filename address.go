package failover

import (
	"net/url"
	"strings"
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

// sameHost reports whether host (a request URL's) names the same
// authority as u, without allocating.
func (u *upstream) sameHost(scheme, host string) bool {
	h, port := splitHostPort(host)
	if port == defaultPort(scheme) {
		port = ""
	}
	if port == "" {
		return strings.EqualFold(h, u.match)
	}
	n := len(u.match) - len(port) - 1
	return n > 0 && u.match[n] == ':' && u.match[n+1:] == port && strings.EqualFold(h, u.match[:n])
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
	if !strings.Contains(p, ".") {
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
// base path wins) and the rest of the path after its base path, decoded and
// escaped, or nil. Both the decoded and the escaped path must lie under the
// base path, so that an encoded slash cannot pass for a path segment.
func (t *Transport) route(u *url.URL) (up *upstream, rest, rawRest string) {
	if u.Opaque != "" || u.Host == "" {
		return nil, "", ""
	}
	raw := u.EscapedPath()
	for _, c := range t.upstreams {
		if !strings.EqualFold(u.Scheme, c.scheme) || !c.sameHost(c.scheme, u.Host) ||
			!underBase(u.Path, c.path) || !underBase(raw, c.rawPath) {
			continue
		}
		if up == nil || len(c.path) > len(up.path) {
			up = c
		}
	}
	if up == nil || hasDotSegment(u.Path) {
		return nil, "", ""
	}
	return up, u.Path[len(up.path):], raw[len(up.rawPath):]
}

// address is route for a request the caller sent (not a redirect hop),
// with Config.Unrouted's fallback: under UnroutedFirst, a URL whose scheme
// and host no upstream has is addressed to the first when its path lies
// under that upstream's base path. (A URL on an upstream's own host is
// that upstream's business: its credentials must not go to the first.)
func (t *Transport) address(u *url.URL) (up *upstream, rest, rawRest string) {
	up, rest, rawRest = t.route(u)
	if up != nil || t.unroutedPolicy != UnroutedFirst || u.Opaque != "" || u.Host == "" || hasDotSegment(u.Path) || t.hostOfUpstream(u) {
		return up, rest, rawRest
	}
	first, raw := t.upstreams[0], u.EscapedPath()
	if !underBase(u.Path, first.path) || !underBase(raw, first.rawPath) {
		return nil, "", ""
	}
	return first, u.Path[len(first.path):], raw[len(first.rawPath):]
}

// hostOfUpstream reports whether some upstream has u's scheme and host.
func (t *Transport) hostOfUpstream(u *url.URL) bool {
	for _, c := range t.upstreams {
		if strings.EqualFold(u.Scheme, c.scheme) && c.sameHost(c.scheme, u.Host) {
			return true
		}
	}
	return false
}

// underBase reports whether path is base or lies under it.
func underBase(path, base string) bool {
	return strings.HasPrefix(path, base) && (len(path) == len(base) || path[len(base)] == '/')
}
