// Package redact scrubs secrets from messages: error text, log lines and
// stream error events that may quote a credential, whole, escaped, decoded
// or cut short.
//
// It knows the forms a secret value takes, not which values are secrets:
// the failover package's credential rule decides that, and hands the
// values here.
package redact

import (
	"encoding/base64"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// MinLen is the length of the shortest secret (or part of one) that is
// scrubbed: shorter ones (a version number) would scrub innocent text.
const MinLen = 8

// authSchemes are the authorization schemes that AppendForms does not take
// for a secret: the word that comes before one ("Bearer sk-..."). Schemes
// shorter than MinLen are never scrubbed anyway.
var authSchemes = []string{"negotiate", "aws4-hmac-sha256", "sharedkey", "sharedkeylite", "privatetoken", "concealed"}

// AppendForms appends to dst every form of the secret value v that a
// message may quote, each at least MinLen long: v itself; its parts
// (split at spaces, tabs, commas and semicolons, without quotes), except a
// leading authorization scheme, and of a part "name=value" only the value
// (a cookie's, a "Signature=..."'s); a Basic credential decoded, and its
// user and password; and the query-, path- and user-info-escaped form of
// each.
func AppendForms(dst []string, v string) []string {
	add := func(s string) {
		if len(s) < MinLen {
			return
		}
		dst = append(dst, s)
		if q := url.QueryEscape(s); q != s {
			dst = append(dst, q)
		}
		if p := url.PathEscape(s); p != s {
			dst = append(dst, p)
		}
		if u := url.User(s).String(); u != s {
			dst = append(dst, u) // as a URL's user info: '$' and ';' kept, '@' and ':' escaped
		}
	}
	add(v)
	fields := strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' || r == ',' || r == ';' })
	basic := false
	for i, f := range fields {
		f = strings.Trim(f, `"`)
		if i == 0 && len(fields) > 1 {
			if strings.EqualFold(f, "basic") {
				basic = true
				continue
			}
			if slices.ContainsFunc(authSchemes, func(s string) bool { return strings.EqualFold(f, s) }) {
				continue
			}
		}
		if name, val, ok := strings.Cut(f, "="); ok && isToken(name) && strings.Trim(val, "=") != "" {
			add(strings.Trim(val, `"`)) // a cookie's value, "Signature=..."'s
		} else {
			add(f)
		}
		if basic && i == 1 {
			dec, err := base64.StdEncoding.DecodeString(f)
			if err != nil {
				dec, err = base64.RawStdEncoding.DecodeString(f)
			}
			if err == nil && utf8.Valid(dec) {
				user, pass, _ := strings.Cut(string(dec), ":")
				add(string(dec))
				add(user)
				add(pass)
			}
		}
	}
	return dst
}

// isToken reports whether s is a plain name: letters, digits, '-', '_'
// and '.', as cookie and parameter names are.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if b := s[i]; !isAlnum(b) && b != '-' && b != '_' && b != '.' {
			return false
		}
	}
	return true
}

func isAlnum(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

// Compact sorts and deduplicates a list of secrets, in place.
func Compact(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// String replaces every secret of the lists in msg with "[REDACTED]",
// wherever it appears, overlapping ones too. A message cut short (a
// stream's error event, clipped) may end in a secret's first bytes: from
// MinLen of them on, they are hidden too, unless they end where a part of
// the secret does (a value of several parts may begin with an innocent
// one: "theme=dark; session=...", whose secret parts are in the lists on
// their own, as AppendForms gives them).
func String(msg string, lists ...[]string) string {
	var hidden []bool // which bytes of msg belong to a secret
	hide := func(i, j int) {
		if hidden == nil {
			hidden = make([]bool, len(msg))
		}
		for ; i < j; i++ {
			hidden[i] = true
		}
	}
	for _, list := range lists {
		for _, s := range list {
			if s == "" {
				continue
			}
			for off := 0; ; {
				i := strings.Index(msg[off:], s)
				if i < 0 {
					break
				}
				i += off
				hide(i, i+len(s))
				off = i + 1
			}
			for n := min(len(s)-1, len(msg)); n >= MinLen; n-- {
				if strings.HasSuffix(msg, s[:n]) {
					if !partEnds(s[n:]) {
						hide(len(msg)-n, len(msg))
					}
					break
				}
			}
		}
	}
	if hidden == nil {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		if !hidden[i] {
			b.WriteByte(msg[i])
			i++
			continue
		}
		b.WriteString("[REDACTED]")
		for i < len(msg) && hidden[i] {
			i++
		}
	}
	return b.String()
}

// partEnds reports whether rest, what follows the first bytes of a
// secret, begins with a separator of its parts (see AppendForms), as
// written or escaped.
func partEnds(rest string) bool {
	if rest[0] == ' ' || rest[0] == '\t' || rest[0] == ',' || rest[0] == ';' {
		return true
	}
	for _, e := range []string{"%20", "%09", "%2C", "%3B"} {
		if strings.HasPrefix(rest, e) {
			return true
		}
	}
	return false
}
