package failover

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/failover-go/failover/internal/redact"
)

// The credential rule. A request header carries the caller's credentials
// when its name, in any case, is one of credentialHeaders, is set by some
// Upstream.Header, is in Config.CredentialHeaders, or matches
// secretSubstrings or secretWords (unless it is one of
// notCredentialHeaders): the patterns fail closed. A query parameter
// carries them unless its name is known to carry none (forwardParams or
// Config.ForwardParams, and neither in Config.CredentialParams nor named
// by some Upstream.Query, which makes it that upstream's own): an allow
// list, since a deny list of query names cannot fail closed. An upstream
// the caller did not address gets neither; the addressed one gets the
// request as the caller wrote it.
var (
	// credentialHeaders are the header names that no pattern catches,
	// or that matter too much to leave to one.
	credentialHeaders = []string{
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

	// credentialParams are query parameters that carry a caller's
	// credentials whatever Config.ForwardParams says (Gemini's key=,
	// Azure SAS's sig=, and the usual spellings of others).
	credentialParams = []string{"key", "api_key", "api-key", "apikey", "access_token", "sig", "code"}

	// forwardParams are the query parameters LLM APIs define that carry
	// no secret, which go to every upstream (see the rule above).
	forwardParams = []string{
		"api-version",                  // Azure OpenAI and Azure AI
		"alt", "$alt", "enum-encoding", // Gemini and Vertex: alt=sse, the Google SDKs' $alt=json;enum-encoding=int
		"beta",                          // Anthropic's beta=true
		"model", "deployment", "intent", // OpenAI's and Azure's Realtime
		"stream", "starting_after", "include", "include[]", // OpenAI's Responses
		"limit", "after", "before", "order", "after_id", "before_id", "pageSize", // pagination: OpenAI, Anthropic, Gemini
		"purpose", "filter", // OpenAI's files and lists
	}

	// secretSubstrings make a name a credential's wherever they appear
	// in it: X-Amz-Security-Token, Ocp-Apim-Subscription-Key,
	// cf-aig-authorization, Helicone-Auth, X-Goog-Signature.
	secretSubstrings = []string{
		"auth", "key", "token", "secret", "passw", "credential", "signature",
		"session", "cookie", "bearer", "jwt", "csrf", "xsrf",
	}

	// secretWords make a name a credential's when they are one of its
	// words (see hasSecretWord): too short to be safe as substrings
	// ("sig" is in "design" and "signal").
	secretWords = []string{"sig", "pw", "pwd", "sid", "otp"}

	// notCredentialHeaders match a pattern but carry no secret.
	notCredentialHeaders = []string{"Idempotency-Key"}
)

// secretSubstringsByFirst holds secretSubstrings by their first letter, so
// that a name is scanned once. It is never written after init.
var secretSubstringsByFirst = func() (by [26][]string) {
	for _, s := range secretSubstrings {
		by[s[0]-'a'] = append(by[s[0]-'a'], s)
	}
	return by
}()

// credentials is the credential rule of one Transport and the secrets it
// knows in advance. New builds it; nothing writes it after but the cache
// of verdicts.
type credentials struct {
	headers map[string]bool // lower case: credentialHeaders, every Upstream.Header name, Config.CredentialHeaders
	params  map[string]bool // lower case: credentialParams, Config.CredentialParams
	forward map[string]bool // lower case: forwardParams and Config.ForwardParams, less params and Upstream.Query names

	// upstreamSecrets are every form of every Upstream.Header, Key.Header
	// and Upstream.Query value, scrubbed from every error message.
	upstreamSecrets []string

	// seen holds the verdicts on the header names met so far, as
	// spelled: SDKs send the same few on every request, and a lookup
	// costs less than the patterns. Copied on write, never changed once
	// stored, and at most maxSeenHeaders long, so that callers sending
	// ever new names cannot grow it.
	seen atomic.Pointer[seenHeaders]
}

// maxSeenHeaders bounds credentials.seen.
const maxSeenHeaders = 256

// seenHeaders is credentials.seen: the first names met in an array, where
// a look compares lengths before bytes and hashes nothing (a request has a
// few headers, the same on every request), and the others in a map.
type seenHeaders struct {
	n       int
	names   [8]string
	verdict [8]bool
	more    map[string]bool
}

// lookup returns the verdict on k, and whether there is one.
func (s *seenHeaders) lookup(k string) (v, ok bool) {
	for i, name := range s.names[:s.n] {
		if name == k {
			return s.verdict[i], true
		}
	}
	v, ok = s.more[k]
	return v, ok
}

// with returns a copy of s (nil: none yet) with the verdict v on k, or s
// itself when it holds maxSeenHeaders already.
func (s *seenHeaders) with(k string, v bool) *seenHeaders {
	next := new(seenHeaders)
	if s != nil {
		if s.n+len(s.more) >= maxSeenHeaders {
			return s
		}
		next.n, next.names, next.verdict = s.n, s.names, s.verdict
		if s.more != nil {
			next.more = make(map[string]bool, len(s.more)+1)
			maps.Copy(next.more, s.more)
		}
	}
	if next.n < len(next.names) {
		next.names[next.n], next.verdict[next.n] = k, v
		next.n++
		return next
	}
	if next.more == nil {
		next.more = make(map[string]bool, 1)
	}
	next.more[k] = v
	return next
}

// newCredentials checks Config.CredentialHeaders, CredentialParams and
// ForwardParams and the upstreams' Query names (no name the rule would
// call a credential's, in a header or as a parameter), and builds the
// rule, with the upstreams' Header names and Header and Query values.
func newCredentials(cfg Config, ups []*upstream) (*credentials, error) {
	c := &credentials{headers: map[string]bool{}, params: map[string]bool{}, forward: map[string]bool{}}
	for _, h := range credentialHeaders {
		c.headers[strings.ToLower(h)] = true
	}
	for _, p := range credentialParams {
		c.params[p] = true
	}
	for i, h := range cfg.CredentialHeaders {
		if !validHeaderName(h) {
			return nil, configError(fmt.Sprintf("CredentialHeaders[%d]", i), "is not a valid header name")
		}
		c.headers[strings.ToLower(h)] = true
	}
	for i, p := range cfg.CredentialParams {
		if p == "" {
			return nil, configError(fmt.Sprintf("CredentialParams[%d]", i), "is empty")
		}
		c.params[strings.ToLower(p)] = true
	}
	for _, p := range forwardParams {
		c.forward[strings.ToLower(p)] = true
	}
	for i, p := range cfg.ForwardParams {
		field := fmt.Sprintf("ForwardParams[%d]", i)
		switch lower := strings.ToLower(p); {
		case p == "":
			return nil, configError(field, "is empty")
		case slices.Contains(credentialParams, lower):
			return nil, configError(field, "is a credential parameter")
		case c.params[lower]:
			return nil, configError(field, "is in CredentialParams")
		default:
			c.forward[lower] = true
		}
	}
	for p := range c.params {
		delete(c.forward, p) // CredentialParams takes a name off forwardParams
	}
	for i, u := range ups {
		for _, name := range u.queryNames {
			lower := strings.ToLower(name)
			if c.params[lower] || looksSecret(name) {
				return nil, configError(fmt.Sprintf("Upstreams[%d].Query", i), fmt.Sprintf("names the credential parameter %q: put credentials in Header", name))
			}
			delete(c.forward, lower) // the upstream's own, as a name its Header sets is
		}
	}
	for _, u := range ups {
		for k, vs := range u.header {
			c.headers[strings.ToLower(k)] = true
			for _, v := range vs {
				c.upstreamSecrets = redact.AppendForms(c.upstreamSecrets, v)
			}
		}
		for _, k := range u.keys {
			for _, f := range k.headers {
				c.headers[strings.ToLower(f.key)] = true
				for _, v := range f.values {
					c.upstreamSecrets = redact.AppendForms(c.upstreamSecrets, v)
				}
			}
		}
		// A Query value is no credential (New refuses those names),
		// but one mistaken for a parameter stays out of errors too.
		for _, vs := range u.cfg.Query {
			for _, v := range vs {
				c.upstreamSecrets = redact.AppendForms(c.upstreamSecrets, v)
			}
		}
	}
	c.upstreamSecrets = redact.Compact(c.upstreamSecrets)
	return c, nil
}

// header reports whether the header named k carries a caller's
// credentials. It allocates only the first time it meets a name.
func (c *credentials) header(k string) bool {
	seen := c.seen.Load()
	if seen != nil {
		if v, ok := seen.lookup(k); ok {
			return v
		}
	}
	v := c.judgeHeader(k)
	if next := seen.with(k, v); next != seen {
		c.seen.CompareAndSwap(seen, next) // when another name won, the next call stores this one
	}
	return v
}

// judgeHeader is header without the cache.
func (c *credentials) judgeHeader(k string) bool {
	if inLower(c.headers, k) {
		return true
	}
	for _, n := range notCredentialHeaders {
		if strings.EqualFold(k, n) {
			return false
		}
	}
	return looksSecret(k)
}

// param reports whether the query parameter named name (unescaped) may
// carry a caller's credentials: unless its name is known to carry none.
func (c *credentials) param(name string) bool {
	return !inLower(c.forward, name)
}

// inLower reports whether name, in lower case, is in set.
func inLower(set map[string]bool, name string) bool {
	var buf [64]byte
	if len(name) > len(buf) {
		return set[strings.ToLower(name)]
	}
	b := buf[:len(name)]
	for i := range len(name) {
		b[i] = lowerASCII(name[i])
	}
	return set[string(b)]
}

// looksSecret reports whether name contains one of secretSubstrings or
// has one of secretWords as a word, in any case.
func looksSecret(name string) bool {
	for i := range len(name) {
		c := lowerASCII(name[i])
		if c < 'a' || c > 'z' {
			continue
		}
		for _, s := range secretSubstringsByFirst[c-'a'] {
			if hasPrefixFold(name[i:], s) {
				return true
			}
		}
	}
	return hasSecretWord(name)
}

// hasSecretWord reports whether one of name's words is one of secretWords.
// Words end at every byte that is no ASCII letter or digit, where a lower
// case letter meets an upper case one, and where letters meet digits:
// "X-Sig", "sigV4" and "pwd2" have one, "design" and "signal" none.
func hasSecretWord(name string) bool {
	start := -1
	for i := 0; i <= len(name); i++ {
		alnum := i < len(name) && isAlnum(name[i])
		if start >= 0 && (!alnum || wordBreak(name[i-1], name[i])) {
			w := name[start:i]
			for _, s := range secretWords {
				if len(w) == len(s) && hasPrefixFold(w, s) {
					return true
				}
			}
			start = -1
		}
		if alnum && start < 0 {
			start = i
		}
	}
	return false
}

// wordBreak reports whether a word ends between the alphanumerics a and b.
func wordBreak(a, b byte) bool {
	digitA, digitB := '0' <= a && a <= '9', '0' <= b && b <= '9'
	return 'a' <= a && a <= 'z' && 'A' <= b && b <= 'Z' || digitA != digitB
}

func isAlnum(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

func lowerASCII(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// hasPrefixFold reports whether s begins with lower, a lower-case ASCII
// string, in any case.
func hasPrefixFold(s, lower string) bool {
	if len(s) < len(lower) {
		return false
	}
	for i := range len(lower) {
		if lowerASCII(s[i]) != lower[i] {
			return false
		}
	}
	return true
}

// stripQuery drops the pairs of a raw query whose name may be a
// credential parameter's: all but those known to carry none.
func (c *credentials) stripQuery(raw string) string {
	return stripQuery(raw, func(pair string) bool { return c.param(queryName(pair)) })
}

// stripQuery drops the pairs of a raw query that drop reports, and keeps
// every other pair byte for byte, in order (url.ParseQuery would drop pairs
// with a ';' and reorder the rest). Pairs are split at '&' and at ';'
// alike, since some servers read ';' as a separator: "a=1;key=k" loses its
// key either way.
func stripQuery(raw string, drop func(pair string) bool) string {
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
		if drop(pair) {
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

// appendRequestSecrets appends to dst every form of the credentials that
// req carries by the rule: its credential headers' and trailers' values,
// its credential query parameters' values, and its URL's user and
// password.
func (c *credentials) appendRequestSecrets(dst []string, req *http.Request) []string {
	dst = c.appendHeaderSecrets(dst, req.Header)
	dst = c.appendHeaderSecrets(dst, req.Trailer)
	return c.appendURLSecrets(dst, req.URL)
}

// appendHeaderSecrets appends to dst every form of the values of h's
// credential headers.
func (c *credentials) appendHeaderSecrets(dst []string, h http.Header) []string {
	for k, vs := range h {
		if c.header(k) {
			for _, v := range vs {
				dst = redact.AppendForms(dst, v)
			}
		}
	}
	return dst
}

// appendURLSecrets appends to dst every form of the values of u's
// credential query parameters, and of its user and password.
func (c *credentials) appendURLSecrets(dst []string, u *url.URL) []string {
	if u == nil {
		return dst
	}
	if u.User != nil {
		dst = redact.AppendForms(dst, u.User.Username())
		if pw, ok := u.User.Password(); ok {
			dst = redact.AppendForms(dst, pw)
		}
	}
	for _, pair := range strings.FieldsFunc(u.RawQuery, func(r rune) bool { return r == '&' || r == ';' }) {
		if c.param(queryName(pair)) {
			_, value, _ := strings.Cut(pair, "=")
			dst = redact.AppendForms(dst, value)
			if v, err := url.QueryUnescape(value); err == nil && v != value {
				dst = redact.AppendForms(dst, v)
			}
		}
	}
	return dst
}

// redact scrubs every known secret from msg: the upstreams' header values
// and the credentials of r, the caller's request, in every form (kept in
// l once computed).
func (l *tally) redact(r *request, msg string) string {
	if l.secrets == nil {
		s := r.t.creds.appendRequestSecrets([]string{}, r.req)
		if r.hop != nil {
			s = append(s, r.hop.secrets...)
		}
		l.secrets = redact.Compact(s)
	}
	return redact.String(msg, r.t.creds.upstreamSecrets, l.secrets)
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
