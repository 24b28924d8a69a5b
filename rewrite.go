package failover

import (
	"context"
	"net/http"
	"net/url"
	"strings"
)

// defaultCredentialHeaders are the header names that carry a caller's
// credentials, besides every name an Upstream.Header sets.
var defaultCredentialHeaders = []string{
	"Authorization",
	"Proxy-Authorization",
	"Api-Key",
	"X-Api-Key",
	"X-Goog-Api-Key",
	"Cookie",
	// Account-scoped: another provider answers 401 to a foreign org.
	"Openai-Organization",
	"Openai-Project",
}

// credentialParams are query parameters that carry a caller's credentials
// (Gemini's key=, and the usual spellings of others).
var credentialParams = []string{"key", "api_key", "api-key", "apikey", "access_token"}

// minSecretLen is the shortest header value that is scrubbed from error
// messages; shorter values (a version number) would scrub innocent text.
const minSecretLen = 8

// clone copies the caller's request for one attempt to up: its own URL and
// header map, without the headers keepHeader leaves out, the value slices
// shared (nothing writes them), and a watchedBody for the attempt's body.
// With the caller's context, the three take one allocation.
func (r *request) clone(ctx context.Context, up *upstream) (*http.Request, *watchedBody) {
	var out *http.Request
	var body *watchedBody
	if ctx == r.req.Context() {
		all := new(struct {
			r http.Request
			u url.URL
			b watchedBody
		})
		all.r, all.u = *r.req, *r.req.URL
		out, body = &all.r, &all.b
		out.URL = &all.u
	} else {
		out = r.req.WithContext(ctx)
		u := *r.req.URL
		out.URL = &u
		body = new(watchedBody)
	}
	h := make(http.Header, len(r.req.Header)+len(up.header))
	for k, v := range r.req.Header {
		if r.keepHeader(k, up) {
			h[k] = v
		}
	}
	out.Header = h
	return out, body
}

// rewrite points out, a clone of the caller's request, at u: scheme, host,
// base path and u's headers. Credentials the caller set go only to the
// upstream the caller addressed (clone left the caller's credential
// headers out for any other).
func (r *request) rewrite(out *http.Request, u *upstream) {
	out.URL.Scheme = u.scheme
	out.URL.Host = u.host
	out.Host = u.host
	if u != r.addressed {
		out.URL.Path = u.path + r.rest
		// url.URL uses RawPath only while it is an encoding of Path;
		// it keeps an encoded base path (".../proxy%2Fopenai/v1").
		if u.rawPath == u.path && r.rawRest == r.rest {
			out.URL.RawPath = out.URL.Path // the same bytes: keeps "!" and friends as sent
		} else {
			out.URL.RawPath = u.rawPath + r.rawRest
		}
		out.URL.User = nil
		out.URL.RawQuery = stripQueryCredentials(out.URL.RawQuery)
	}
	for k, v := range u.header {
		out.Header[k] = v
	}
}

// keepHeader reports whether the caller's header k goes to u: not when u's
// Header replaces it, in any spelling (net/http would send a non-canonical
// key as a second header), nor, for an upstream the caller did not address,
// when it carries a credential.
func (r *request) keepHeader(k string, u *upstream) bool {
	if _, ok := u.header[k]; ok {
		return false
	}
	ck := k
	if !canonicalASCII(k) {
		ck = http.CanonicalHeaderKey(k)
		if _, ok := u.header[ck]; ok {
			return false
		}
	}
	if u != r.addressed {
		for _, name := range r.t.credHeaders {
			if ck == name {
				return false
			}
		}
	}
	return true
}

// canonicalASCII reports, quickly, whether k is already in canonical form
// ("Content-Type"); false only costs a call to http.CanonicalHeaderKey.
func canonicalASCII(k string) bool {
	upper := true
	for i := 0; i < len(k); i++ {
		b := k[i]
		switch {
		case upper && 'a' <= b && b <= 'z', !upper && 'A' <= b && b <= 'Z', b <= ' ', b >= 0x7f:
			return false
		}
		upper = b == '-'
	}
	return true
}

// stripQueryCredentials drops the pairs of a raw query whose name is a
// credential parameter, and keeps every other pair byte for byte, in order
// (url.ParseQuery would drop pairs with a ';' and reorder the rest). Pairs
// are split at '&' and at ';' alike, since some servers read ';' as a
// separator: "a=1;key=k" loses its key either way.
func stripQueryCredentials(raw string) string {
	if raw == "" {
		return raw
	}
	var b strings.Builder
	changed, wrote := false, false
	sep := byte(0) // the separator before the current pair
	for rest := raw; ; {
		i := strings.IndexAny(rest, "&;")
		pair := rest
		if i >= 0 {
			pair = rest[:i]
		}
		if isCredentialParam(queryName(pair)) {
			changed = true
		} else {
			if wrote {
				b.WriteByte(sep)
			}
			b.WriteString(pair)
			wrote = true
		}
		if i < 0 {
			break
		}
		sep, rest = rest[i], rest[i+1:]
	}
	if !changed {
		return raw
	}
	return b.String()
}

// queryName returns the unescaped name of a raw query pair.
func queryName(pair string) string {
	name, _, _ := strings.Cut(pair, "=")
	if n, err := url.QueryUnescape(name); err == nil {
		return n
	}
	return name
}

func isCredentialParam(name string) bool {
	for _, p := range credentialParams {
		if strings.EqualFold(name, p) {
			return true
		}
	}
	return false
}

// redact replaces every known secret in msg: the upstreams' header values,
// and the caller's credential header values, key= query values and URL
// password.
func (t *Transport) redact(msg string, req *http.Request) string {
	scrub := func(v string) {
		if len(v) >= minSecretLen {
			msg = strings.ReplaceAll(msg, v, "[REDACTED]")
		}
	}
	for _, s := range t.secrets {
		scrub(s)
	}
	for _, name := range t.credHeaders {
		for _, v := range req.Header.Values(name) {
			scrub(v)
		}
	}
	if u := req.URL; u != nil {
		if u.User != nil {
			if pw, ok := u.User.Password(); ok {
				scrub(pw)
				scrub(url.QueryEscape(pw))
			}
		}
		for _, pair := range strings.FieldsFunc(u.RawQuery, func(r rune) bool { return r == '&' || r == ';' }) {
			if isCredentialParam(queryName(pair)) {
				_, value, _ := strings.Cut(pair, "=")
				scrub(value)
				if v, err := url.QueryUnescape(value); err == nil {
					scrub(v)
				}
			}
		}
	}
	return msg
}

// validHeaderName reports whether k is a valid header field name (an RFC 9110 token).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if r <= ' ' || r >= 0x7f || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", r) {
			return false
		}
	}
	return true
}
