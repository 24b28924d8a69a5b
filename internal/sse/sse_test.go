package sse

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// readCase is a stream and what a Reader finds in it: "comment", or an
// event as event writes it.
type readCase struct {
	name string
	in   string
	max  int // for Buffer; 0: the default
	want []string
}

// event is how a test writes an event: its type, data, last event id and
// retry, and "parted" when its data went out in Parts.
func event(typ, data string, more ...string) string {
	s := fmt.Sprintf("event %q %q", typ, data)
	for _, m := range more {
		s += " " + m
	}
	return s
}

var readCases = []readCase{
	{name: "one event", in: "data: hello\n\n", want: []string{event("", "hello")}},
	{name: "typed event", in: "event: message_start\ndata: {\"a\":1}\n\n", want: []string{event("message_start", `{"a":1}`)}},
	{name: "two events", in: "data: 1\n\nevent: e\ndata: 2\n\n", want: []string{event("", "1"), event("e", "2")}},
	{name: "type is the event's own", in: "event: a\ndata: 1\n\ndata: 2\n\n", want: []string{event("a", "1"), event("", "2")}},
	{name: "last type counts", in: "event: a\nevent: b\ndata: x\n\n", want: []string{event("b", "x")}},
	{name: "data lines joined", in: "data: a\ndata:b\ndata\ndata:  c\ndata:\n\n", want: []string{event("", "a\nb\n\n c\n")}},
	{name: "no space after the colon", in: "data:x\n\n", want: []string{event("", "x")}},
	{name: "colons in the value", in: "data: a: b:c\n\n", want: []string{event("", "a: b:c")}},
	{name: "name alone is an empty value", in: "data\n\n", want: []string{event("", "")}},
	{name: "empty type and no data is nothing", in: "event\n\nevent:\n\n", want: nil},
	{name: "type without data", in: "event: error\n\n", want: []string{event("error", "")}},
	{name: "CRLF", in: "data: a\r\ndata: b\r\n\r\nevent: e\r\ndata: c\r\n\r\n", want: []string{event("", "a\nb"), event("e", "c")}},
	{name: "CR", in: "data: a\rdata: b\r\revent: e\rdata: c\r\r", want: []string{event("", "a\nb"), event("e", "c")}},
	{name: "mixed line ends", in: "data: a\r\ndata: b\rdata: c\n\r\n", want: []string{event("", "a\nb\nc")}},
	{name: "LF CR is two line ends", in: "data: a\n\rdata: b\n\n", want: []string{event("", "a"), event("", "b")}},
	{name: "blank lines only", in: "\n\n\r\n\r\r", want: nil},
	{name: "comments", in: ": ping\n\ndata: x\n: in an event\n\n:\n", want: []string{"comment", "comment", event("", "x"), "comment"}},
	{name: "unknown fields", in: "foo: bar\nlongname: x\ndatax: y\nData: z\nretries: 1\ndata: ok\n\n", want: []string{event("", "ok")}},
	{name: "id and retry", in: "id: 42\nretry: 1500\ndata: x\n\ndata: y\n\n", want: []string{event("", "x", `id="42"`, "retry=1.5s"), event("", "y", `id="42"`, "retry=1.5s")}},
	{name: "id emptied", in: "id: 1\ndata: a\n\nid\ndata: b\n\n", want: []string{event("", "a", `id="1"`), event("", "b")}},
	{name: "id with NUL ignored", in: "id: 1\nid: 2\x003\ndata: a\n\n", want: []string{event("", "a", `id="1"`)}},
	{name: "retry not a number ignored", in: "retry: 10\nretry: 15x\nretry:\nretry: -1\ndata: a\n\n", want: []string{event("", "a", "retry=10ms")}},
	{name: "retry too large saturates", in: "retry: 99999999999999999999999\ndata: a\n\n", want: []string{event("", "a", fmt.Sprintf("retry=%v", time.Duration(maxRetry)*time.Millisecond))}},
	{name: "unterminated last event", in: "data: a\n\ndata: b", want: []string{event("", "a"), event("", "b")}},
	{name: "unterminated last line, CR", in: "event: e\ndata: b\r", want: []string{event("e", "b")}},
	{name: "unterminated name alone", in: "data: a\ndata", want: []string{event("", "a\n")}},
	{name: "unterminated comment", in: "data: a\n: c", want: []string{"comment", event("", "a")}},
	{name: "unterminated type", in: "data: a\nevent: e", want: []string{event("e", "a")}},
	{name: "empty stream", in: "", want: nil},
	{name: "BOM", in: "\xEF\xBB\xBFdata: a\n\n", want: []string{event("", "a")}},
	{name: "BOM then comment", in: "\xEF\xBB\xBF: hi\n", want: []string{"comment"}},
	{name: "BOM only", in: "\xEF\xBB\xBF", want: nil},
	{name: "BOM twice: the second is a name", in: "\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n", want: []string{event("", "b")}},
	{name: "BOM cut short is a name", in: "\xEF\xBBdata: a\n\ndata: b\n\n", want: []string{event("", "b")}},
	{name: "BOM's first byte is a name", in: "\xEFdata: a\n\ndata: b\n\n", want: []string{event("", "b")}},
	{name: "BOM's first bytes, then a line end", in: "\xEF\xBB\n: c\n", want: []string{"comment"}},
	{name: "BOM's first byte alone", in: "\xEF", want: nil},
	{name: "BOM's first byte, then data", in: "\xEF\ndata: a", want: []string{event("", "a")}},
	{name: "BOM later is data", in: "data: a\n\ndata: \xEF\xBB\xBF\n\n", want: []string{event("", "a"), event("", "\xEF\xBB\xBF")}},
	{name: "long type", in: "event: " + strings.Repeat("t", 100) + "\ndata: x\n\nevent: s\n\n", want: []string{event(strings.Repeat("t", 100), "x"), event("s", "")}},
	{name: "max: data as large", max: 8, in: "data: 12345678\n\n", want: []string{event("", "12345678")}},
	{name: "max: data larger", max: 8, in: "data: 123456789\n\n", want: []string{event("", "123456789", "parted")}},
	{name: "max: lines joined larger", max: 8, in: "data: 1234\ndata: 5678\n\n", want: []string{event("", "1234\n5678", "parted")}},
	{name: "max: the LF past it", max: 4, in: "data: 1234\ndata\ndata: 5\n\n", want: []string{event("", "1234\n\n5", "parted")}},
	{name: "max: next event held again", max: 8, in: "data: 123456789\n\ndata: a\n\n", want: []string{event("", "123456789", "parted"), event("", "a")}},
	{name: "max: larger, unterminated", max: 2, in: "data: 12\ndata", want: []string{event("", "12\n", "parted")}},
	{name: "max: type and id cut", max: 4, in: "event: 123456\nid: abcdef\ndata: x\n\n", want: []string{event("1234", "x", `id="abcd"`)}},
}

// read feeds r the chunks, reading after each, then ends the stream. It
// returns what r found, each event's Parts joined.
func read(r *Reader, chunks ...[]byte) []string {
	var got []string
	var parts []byte
	parted := false
	next := func() {
		for {
			switch k := r.Next(); k {
			case None:
				return
			case Comment:
				got = append(got, "comment")
			case Part:
				parts = append(parts, r.Data()...)
				parted = true
			case Event:
				var more []string
				if id := r.LastEventID(); len(id) > 0 {
					more = append(more, fmt.Sprintf("id=%q", id))
				}
				if d, ok := r.Retry(); ok {
					more = append(more, fmt.Sprintf("retry=%v", d))
				}
				if parted {
					more = append(more, "parted")
				}
				got = append(got, event(string(r.Type()), string(parts)+string(r.Data()), more...))
				parts, parted = parts[:0], false
			default:
				panic(fmt.Sprintf("Next returned %d", k))
			}
		}
	}
	for _, c := range chunks {
		r.Feed(c)
		next()
	}
	r.End()
	next()
	return got
}

// splits calls f with every way to cut s into one, two or three chunks,
// empty ones among them.
func splits(s string, f func(chunks ...[]byte)) {
	b := []byte(s)
	for i := 0; i <= len(b); i++ {
		for j := i; j <= len(b); j++ {
			f(b[:i:i], b[i:j:j], b[j:])
		}
	}
	f(b)
}

func runRead(t *testing.T, c readCase) {
	t.Helper()
	splits(c.in, func(chunks ...[]byte) {
		t.Helper()
		var r Reader
		if c.max > 0 {
			r.Buffer(nil, c.max)
		}
		got := read(&r, chunks...)
		if !slices.Equal(got, c.want) {
			t.Fatalf("fed %q: got %q, want %q", chunks, got, c.want)
		}
		if c.max > 0 && (cap(r.data) > c.max || r.typ.n > c.max || len(r.id) > c.max) {
			t.Fatalf("fed %q: held %d bytes of data, %d of type, %d of id; max %d", chunks, cap(r.data), r.typ.n, len(r.id), c.max)
		}
	})
}

func TestReader(t *testing.T) {
	for _, c := range readCases {
		t.Run(c.name, func(t *testing.T) { runRead(t, c) })
	}
}

// The reference reading agrees with the table, so that FuzzReader can
// trust it.
func TestReference(t *testing.T) {
	for _, c := range readCases {
		if got := reference([]byte(c.in), c.max); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// A Part goes out as the data comes, before its line ends, and the data
// held first goes out first.
func TestPartsAsTheyCome(t *testing.T) {
	var r Reader
	r.Buffer(make([]byte, 0, 4), 4)
	r.Feed([]byte("data: ab\ndata: cdefg"))
	var got []string
	for k := r.Next(); k != None; k = r.Next() {
		got = append(got, fmt.Sprintf("%d %q", k, r.Data()))
	}
	want := []string{fmt.Sprintf("%d %q", Part, "ab\n"), fmt.Sprintf("%d %q", Part, "cdefg")}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A Reader reads a stream without allocating once its buffers have grown.
func TestReaderAllocs(t *testing.T) {
	chunk := []byte("event: response.output_text.delta\r\nid: 7\r\ndata: {\"delta\":\"Hi\"}\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n")
	var r Reader
	r.Buffer(make([]byte, 0, 64), 64)
	allocs := testing.AllocsPerRun(100, func() {
		r.Feed(chunk)
		for r.Next() != None {
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per stream piece, want 0", allocs)
	}
}

// reference reads a whole stream the plain way: line by line, as the
// standard describes it.
func reference(in []byte, max int) []string {
	if max <= 0 {
		max = DefaultMax
	}
	s := strings.TrimPrefix(string(in), "\xEF\xBB\xBF")
	var (
		out      []string
		data     []string
		hasData  bool
		typ, id  string
		retry    int64
		hasRetry bool
	)
	cut := func(v string) string { return v[:min(len(v), max)] }
	dispatch := func() {
		if hasData || typ != "" {
			var more []string
			if id != "" {
				more = append(more, fmt.Sprintf("id=%q", id))
			}
			if hasRetry {
				more = append(more, fmt.Sprintf("retry=%v", time.Duration(retry)*time.Millisecond))
			}
			d := strings.Join(data, "\n")
			if len(d) > max {
				more = append(more, "parted")
			}
			out = append(out, event(cut(typ), d, more...))
		}
		data, hasData, typ = nil, false, ""
	}
	for len(s) > 0 {
		line := s
		s = ""
		if i := strings.IndexAny(line, "\r\n"); i >= 0 {
			crlf := strings.HasPrefix(line[i:], "\r\n")
			line, s = line[:i], line[i+1:]
			if crlf {
				s = s[1:]
			}
		}
		switch {
		case line == "":
			dispatch()
		case line[0] == ':':
			out = append(out, "comment")
		default:
			name, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch name {
			case "data":
				data, hasData = append(data, value), true
			case "event":
				typ = value
			case "id":
				if !strings.Contains(value, "\x00") {
					id = cut(value)
				}
			case "retry":
				if value != "" && strings.Trim(value, "0123456789") == "" {
					retry = 0
					for _, c := range value {
						retry = min(10*retry+int64(c-'0'), maxRetry)
					}
					hasRetry = true
				}
			}
		}
	}
	dispatch()
	return out
}

// FuzzReader checks the Reader against the reference reading, fed the
// stream whole and in chunks of the sizes given, under a max of its own.
func FuzzReader(f *testing.F) {
	for _, c := range readCases {
		f.Add([]byte(c.in), []byte{1, 0, 7}, uint8(c.max))
	}
	f.Fuzz(func(t *testing.T, in, sizes []byte, max uint8) {
		want := reference(in, int(max))
		var r Reader
		r.Buffer(nil, int(max))
		if got := read(&r, in); !slices.Equal(got, want) {
			t.Fatalf("whole: got %q, want %q", got, want)
		}
		var chunks [][]byte
		for rest, i := in, 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(sizes) > 0 {
				n = min(n, int(sizes[i%len(sizes)]))
			}
			if n == 0 && i%len(sizes) == len(sizes)-1 {
				n = 1 // sizes of zeros only: empty chunks, then a byte
			}
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		r = Reader{}
		r.Buffer(nil, int(max))
		if got := read(&r, chunks...); !slices.Equal(got, want) {
			t.Fatalf("in chunks %q: got %q, want %q", chunks, got, want)
		}
	})
}

func BenchmarkReader(b *testing.B) {
	var stream bytes.Buffer
	for stream.Len() < 1<<20 {
		stream.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}],"usage":null}` + "\n\n")
	}
	p := stream.Bytes()
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		var r Reader
		r.Buffer(make([]byte, 0, 4<<10), 4<<10)
		for at := 0; at < len(p); at += 4 << 10 {
			r.Feed(p[at:min(at+4<<10, len(p))])
			for r.Next() != None {
			}
		}
		r.End()
		for r.Next() != None {
		}
	}
}
