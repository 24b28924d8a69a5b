package failover

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// FuzzGuardStream gives the stream guard arbitrary bytes, in reads of
// arbitrary sizes, under arbitrary limits. It never panics; what it decides
// does not depend on how the reads split the stream; a stream it returns
// reads back exactly as sent; a stream it abandons is closed exactly once,
// with an error that carries at most 200 bytes of the event. The seed
// corpus is the table of TestGuardStreams and testdata/fuzz/FuzzGuardStream.
func FuzzGuardStream(f *testing.F) {
	for i, c := range guardCases {
		if len(c.stream) > 64<<10 {
			continue
		}
		f.Add([]byte(c.stream), []byte{byte(i), 1, 200, 3}, c.g.HoldEvents, c.g.HoldBytes, i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, stream, sizes []byte, holdEvents, holdBytes int, async bool) {
		g := StreamGuard{HoldEvents: holdEvents % 80, HoldBytes: holdBytes % (8 << 10)}
		if async {
			g.FirstByteTimeout = time.Hour // reads through the goroutine; never fires
		}

		// What the guard decides with the whole stream in one read.
		want, wantErr := g.guard(sseResponse(newGuardBody(bytes.NewReader(stream))))
		if want != nil {
			want.Body.Close()
		}

		body := newGuardBody(&guardReads{data: stream, sizes: sizes})
		resp, err := g.guard(sseResponse(body))
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("split into reads of %v: got %v, want %v", sizes, err, wantErr)
		}
		if err != nil {
			if resp != nil {
				t.Errorf("got a response with error %v", err)
			}
			if !errors.Is(err, ErrStreamError) {
				t.Errorf("got %v, want %v", err, ErrStreamError)
			}
			prefix := ErrStreamError.Error()
			if msg := err.Error(); msg != prefix && (!strings.HasPrefix(msg, prefix+": ") || len(msg)-len(prefix)-2 > maxErrorDetail) {
				t.Errorf("error carries more than %d bytes of the event: %q", maxErrorDetail, msg)
			}
			if n := body.closes.Load(); n != 1 {
				t.Errorf("original body closed %d times, want 1", n)
			}
			return
		}
		if resp.Header.Get("Content-Type") == "" || resp.StatusCode != http.StatusOK {
			t.Fatalf("response changed: %d %v", resp.StatusCode, resp.Header)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Errorf("reading the stream: %v", err)
		}
		if !bytes.Equal(got, stream) {
			t.Errorf("stream changed: got %q, want %q", got, stream)
		}
		if resp.Body == io.ReadCloser(body) {
			// Left alone: holding disabled and no FirstByteTimeout.
			if g.FirstByteTimeout > 0 || g.HoldEvents >= 0 && g.HoldBytes >= 0 {
				t.Errorf("guard %+v left the stream alone", g)
			}
			resp.Body.Close()
			return
		}
		checkCloseOnce(t, resp.Body, body)
	})
}

// guardReads returns data in reads of the sizes given (each size byte plus
// one, in turn; all at once when there are none). With an odd number of
// sizes, the last read returns io.EOF with the last bytes.
type guardReads struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *guardReads) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if len(r.sizes) > 0 {
		n = min(n, 1+int(r.sizes[r.i%len(r.sizes)]))
		r.i++
	}
	n = copy(p, r.data[:min(n, len(r.data))])
	r.data = r.data[n:]
	if len(r.data) == 0 && len(r.sizes)%2 == 1 {
		return n, io.EOF
	}
	return n, nil
}
