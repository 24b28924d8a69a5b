package redact

import (
	"encoding/base64"
	"slices"
	"testing"
)

// AppendForms gives every form of a secret value a message may quote, and
// none shorter than MinLen.
func TestAppendForms(t *testing.T) {
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("svc:up-basic-pass-123"))
	for _, tt := range []struct {
		name     string
		v        string
		want     []string // among the forms
		wantNone []string // not among them
	}{
		{"bearer", "Bearer sk-up/a+b=0123456789",
			[]string{"Bearer sk-up/a+b=0123456789", "sk-up/a+b=0123456789", "sk-up%2Fa%2Bb%3D0123456789", "sk-up%2Fa+b=0123456789"},
			[]string{"Bearer"}},
		{"basic", basic,
			[]string{basic, "svc:up-basic-pass-123", "up-basic-pass-123", "svc%3Aup-basic-pass-123"},
			[]string{"Basic", "svc"}},
		{"basic, unpadded", "Basic " + base64.RawStdEncoding.EncodeToString([]byte("user:caller-basic-pass99")),
			[]string{"caller-basic-pass99"}, nil},
		{"several keys", "k1-aaaaaaaaaa, k2-bbbbbbbbbb", []string{"k1-aaaaaaaaaa", "k2-bbbbbbbbbb"}, nil},
		{"cookie", "theme=dark; session=caller-cookie-0123456789",
			[]string{"caller-cookie-0123456789"}, []string{"theme=dark", "dark", "session=caller-cookie-0123456789"}},
		{"quoted signature", `Signature="c2lnbmF0dXJlMDEyMzQ1Njc4OQ=="`, []string{"c2lnbmF0dXJlMDEyMzQ1Njc4OQ=="}, nil},
		{"scheme of its own", "SharedKey account:c2lnbmF0dXJl", []string{"account:c2lnbmF0dXJl", "account%3Ac2lnbmF0dXJl"}, []string{"SharedKey"}},
		{"user info", "p@ss:word;1234", []string{"p%40ss%3Aword;1234"}, nil},
		{"short", "v1", nil, []string{"v1"}},
	} {
		got := AppendForms(nil, tt.v)
		for _, w := range tt.want {
			if !slices.Contains(got, w) {
				t.Errorf("%s: AppendForms(%q) = %q, without %q", tt.name, tt.v, got, w)
			}
		}
		for _, w := range tt.wantNone {
			if slices.Contains(got, w) {
				t.Errorf("%s: AppendForms(%q) = %q, with %q", tt.name, tt.v, got, w)
			}
		}
		for _, s := range got {
			if len(s) < MinLen {
				t.Errorf("%s: AppendForms(%q) gives %q, shorter than MinLen", tt.name, tt.v, s)
			}
		}
	}
	if got := AppendForms([]string{"kept"}, "sk-0123456789"); got[0] != "kept" {
		t.Errorf("AppendForms dropped what dst held: %q", got)
	}
}

func TestCompact(t *testing.T) {
	got := Compact([]string{"b-secret-2", "a-secret-1", "b-secret-2", "a-secret-1"})
	if want := []string{"a-secret-1", "b-secret-2"}; !slices.Equal(got, want) {
		t.Errorf("Compact = %q, want %q", got, want)
	}
}

// String hides every occurrence of every secret, overlapping ones in one
// mark, and the first MinLen or more bytes of one that ends the message
// unless they end where one of its parts does.
func TestString(t *testing.T) {
	const key = "sk-0123456789abcdef"
	for _, tt := range []struct {
		name  string
		msg   string
		lists [][]string
		want  string
	}{
		{"none", "dial tcp: connection refused", [][]string{{key}}, "dial tcp: connection refused"},
		{"no lists", "key " + key, nil, "key " + key},
		{"every occurrence", "key " + key + " and again " + key + ".", [][]string{{key}}, "key [REDACTED] and again [REDACTED]."},
		{"either list", "a aaaaaaaa-1 b bbbbbbbb-2", [][]string{{"aaaaaaaa-1"}, {"bbbbbbbb-2"}}, "a [REDACTED] b [REDACTED]"},
		{"overlapping", "x 0123456789abcdefXYZ y", [][]string{{"0123456789abc", "9abcdefXYZ"}}, "x [REDACTED] y"},
		{"adjacent occurrences", key + key, [][]string{{key}}, "[REDACTED]"},
		{"empty secret", "msg", [][]string{{""}}, "msg"},
		{"clipped", "invalid key: " + key[:MinLen+2], [][]string{{key}}, "invalid key: [REDACTED]"},
		{"clipped to MinLen", "invalid key: " + key[:MinLen], [][]string{{key}}, "invalid key: [REDACTED]"},
		{"clipped below MinLen", "invalid key: " + key[:MinLen-1], [][]string{{key}}, "invalid key: " + key[:MinLen-1]},
		{"clipped at a part", "cookie theme=dark", [][]string{{"theme=dark; session=caller-cookie-0123456789"}}, "cookie theme=dark"},
		{"clipped at an escaped part", "cookie theme=dark", [][]string{{"theme=dark%3B%20session=caller-cookie-0123456789"}}, "cookie theme=dark"},
		{"clipped within a part", "cookie theme=dark; sess", [][]string{{"theme=dark; session=caller-cookie-0123456789"}}, "cookie [REDACTED]"},
	} {
		if got := String(tt.msg, tt.lists...); got != tt.want {
			t.Errorf("%s: String(%q) = %q, want %q", tt.name, tt.msg, got, tt.want)
		}
	}
}

func BenchmarkRedact(b *testing.B) {
	upstream := Compact(AppendForms(nil, "Bearer sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"))
	caller := Compact(AppendForms(AppendForms(nil, "Bearer sk-ant-0123456789abcdef"), "AIzaSyD-0123456789abcdefgh"))
	msg := `Post "https://generativelanguage.googleapis.com/v1beta/models/gemini:generateContent?key=AIzaSyD-0123456789abcdefgh": dial tcp: connection refused`
	b.ReportAllocs()
	for b.Loop() {
		String(msg, upstream, caller)
	}
}

func BenchmarkRedactForms(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		Compact(AppendForms(AppendForms(nil, "Bearer sk-ant-0123456789abcdef"), "Basic dXNlcm5hbWU6cGFzc3dvcmQxMjM="))
	}
}
