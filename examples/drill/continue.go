package main

// The continuation part plays streams that break after their content
// began, through a failover.Transport with Config.Continue on and, as the
// comparison, off: a primary that cuts the connection after a few
// content chunks, one that goes silent there, one that ends the stream
// there without its last events, and one that cuts while the backup
// refuses the continuation (a 400, as Claude models that refuse prefill
// answer). It counts what the caller read: the whole answer, the
// original error, or a short answer that ends like a success.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover"
)

// The continuation part's sizes, and its times at provider scale (before
// -timescale).
const (
	contStreams  = 200 // streams of each row
	contParallel = 10  // streams at once, in each row
	contCutAfter = 5   // content chunks the primary sends before it breaks
	contAnswer   = 120 // bytes of each answer, a word a chunk

	contFirst       = 300 * time.Millisecond // the primary's time to its first chunk
	contBackupFirst = 200 * time.Millisecond // the backup's time to its first chunk
	contChunkGap    = 40 * time.Millisecond  // between two chunks of a stream
	contIdle        = 3 * time.Second        // Timeouts.Idle of the primary, in the stall rows
)

// contFault is how the primary's stream breaks in a row.
type contFault int

const (
	contCut     contFault = iota // the connection drops after contCutAfter chunks
	contStall                    // the stream goes silent after contCutAfter chunks
	contEnd                      // the stream ends after contCutAfter chunks, with no finish reason or [DONE]
	contRefused                  // the connection drops, and the backup answers the continuation 400
)

func (f contFault) String() string {
	return [...]string{"cut", "stall", "early end", "refused"}[f]
}

// cause is the error a caller must get when f's stream is not continued:
// the primary's own, or, for a stream that ended early, the Transport's
// word for it. Without continuation, such a stream ends with no error.
func (f contFault) cause() error {
	switch f {
	case contStall:
		return failover.ErrStreamStalled
	case contEnd:
		return failover.ErrStreamTruncated
	}
	return io.ErrUnexpectedEOF
}

// contOptions configure the continuation part.
type contOptions struct {
	Streams   int // streams of each row
	Parallel  int // streams at once, in each row
	Timescale float64
	Model     string
}

// defaultContinue returns the continuation part's options at the drill's
// timescale and model.
func defaultContinue(o options) contOptions {
	return contOptions{Streams: contStreams, Parallel: contParallel, Timescale: o.Timescale, Model: o.Model}
}

func (o contOptions) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * o.Timescale)
}

// contRow is what the caller of one row read.
type contRow struct {
	Fault contFault
	On    bool // Config.Continue.On

	Streams  int // streams sent
	Complete int // read whole: the expected text, one id, one finish reason, [DONE]
	Original int // ended in the primary's own error (Fault.cause)
	Other    int // ended in another error
	Short    int // ended like a success (EOF) with the answer short or wrong

	// Continued and NotContinued count the breaks the Trace reported
	// continued and not; NotWhy is why the first was not.
	Continued, NotContinued int
	NotWhy                  string

	// FirstAtBackup counts the streams the backup answered first: none,
	// unless the primary was passed over, which the part must not do.
	FirstAtBackup int64

	// OtherErr is the first error counted in Other.
	OtherErr string

	// Added50 and Added99 are the percentiles of the time the caller
	// waited at the break, less what an unbroken stream waits there (a
	// chunk gap) or, for a stall, less Timeouts.Idle, the silence that
	// tells it; over the streams continued.
	Added50, Added99 time.Duration
}

// Name is the row's name in the table.
func (r contRow) Name() string {
	if r.On {
		return r.Fault.String() + ", on"
	}
	return r.Fault.String() + ", off"
}

// contDrill plays the continuation part as o says and writes its table
// to out.
func contDrill(ctx context.Context, o contOptions, out io.Writer) error {
	rows, err := contRows(ctx, o)
	if err != nil {
		return err
	}
	return writeContinue(out, o, rows)
}

// contRows plays the part's rows, all at once with servers and
// Transports of their own: each fault with continuation on, then off.
func contRows(ctx context.Context, o contOptions) ([]contRow, error) {
	if o.Streams <= 0 || o.Parallel <= 0 || o.Timescale <= 0 {
		return nil, errors.New("continue: streams, parallel and timescale must be positive")
	}
	if o.Streams > 1000 {
		return nil, errors.New("continue: at most 1000 streams a row (the primary's FailureThreshold)")
	}
	if o.Model == "" {
		o.Model = "gpt-4o-mini"
	}
	var rows []contRow
	for _, f := range []contFault{contCut, contStall, contEnd, contRefused} {
		rows = append(rows, contRow{Fault: f, On: true}, contRow{Fault: f})
	}
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	for i := range rows {
		wg.Go(func() { errs[i] = playContinue(ctx, o, &rows[i]) })
	}
	wg.Wait()
	return rows, errors.Join(errs...)
}

// playContinue plays row's streams through a failover.Transport over a
// fresh primary and backup, and fills in what the caller read.
func playContinue(ctx context.Context, o contOptions, row *contRow) error {
	primary := newContServer(o, row.Fault, false)
	defer primary.close()
	backup := newContServer(o, row.Fault, true)
	defer backup.close()

	p := failover.Upstream{
		Name:    "primary",
		BaseURL: primary.baseURL(),
		// Every stream of the row breaks on the primary, and every
		// stream must begin there: its circuit must not open.
		Breaker: &failover.BreakerConfig{FailureThreshold: 1000},
	}
	idle := time.Duration(0)
	if row.Fault == contStall {
		idle = o.scaled(contIdle)
		p.Timeouts.Idle = idle
	}
	base := newBase()
	defer base.CloseIdleConnections()
	ft, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{p, {
			Name:    "backup",
			BaseURL: backup.baseURL(),
			Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant},
		}},
		Base:     base,
		Continue: failover.ContinueConfig{On: row.On},
		// Every stream of a row breaks within a few milliseconds of
		// others: the default budget (3, or a fifth of the requests
		// in flight) would refuse most continuations, as it should in
		// an outage, and the part would measure the budget.
		Retry: failover.RetryConfig{BudgetMin: o.Parallel},
		// Time runs faster here (-timescale): a stall of a loaded
		// machine looks like seconds of silence, and hang detection
		// would send streams to the backup first. The primary never
		// hangs before its headers.
		Hang: failover.HangConfig{Off: true},
	})
	if err != nil {
		return err
	}
	defer ft.Close()
	client := &http.Client{Transport: ft, Timeout: callerTimeout}
	url := primary.baseURL() + "/chat/completions"

	var (
		mu    sync.Mutex
		added []time.Duration
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	want, name := row.Fault.cause(), row.Name()
	unbroken := o.scaled(contChunkGap) // what the caller waits at the break in a stream that does not break
	if row.Fault == contStall {
		unbroken = idle // the silence that tells a stall, from the last chunk
	}
	for range min(o.Parallel, o.Streams) {
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= o.Streams || ctx.Err() != nil {
					return
				}
				question := fmt.Sprintf("Question %04d of the %s row", n, name)
				var continued, not int
				var why string
				tr := &failover.Trace{Continued: func(c failover.TraceContinued) {
					if c.Err == nil {
						continued++
					} else {
						not++
						why = c.Err.Error()
					}
				}}
				rd := readContinued(failover.WithTrace(ctx, tr), client, url, o.Model, question)
				full := answerTo(question)
				mu.Lock()
				row.Streams++
				row.Continued += continued
				row.NotContinued += not
				if row.NotWhy == "" {
					row.NotWhy = why
				}
				switch {
				case rd.err == nil && rd.complete(full):
					row.Complete++
				case rd.err == nil:
					row.Short++
				case errors.Is(rd.err, want):
					row.Original++
				default:
					row.Other++
					if row.OtherErr == "" {
						row.OtherErr = rd.err.Error()
					}
				}
				if continued > 0 && rd.err == nil && len(rd.times) > contCutAfter {
					added = append(added, rd.times[contCutAfter].Sub(rd.times[contCutAfter-1])-unbroken)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	slices.Sort(added)
	row.Added50, row.Added99 = percentile(added, 0.5), percentile(added, 0.99)
	row.FirstAtBackup = backup.fresh.Load()
	return nil
}

// answerTo is the answer both upstreams give to question, whole.
func answerTo(question string) string {
	return filler("Answer to "+question+":", contAnswer)
}

// words splits text into the chunks a stream sends: a word each, with
// the space before it.
func words(text string) []string {
	var out []string
	for text != "" {
		i := strings.IndexByte(text[1:], ' ') + 1
		if i == 0 {
			i = len(text)
		}
		out = append(out, text[:i])
		text = text[i:]
	}
	return out
}

// contRead is what the caller of one stream read, as an SDK reads it:
// each event once the blank line that ends it came.
type contRead struct {
	text   strings.Builder
	ids    map[string]bool
	finish int
	done   bool
	times  []time.Time // when each chunk with content was read
	err    error       // why the body ended, nil for io.EOF
}

// complete reports whether r read the whole answer full, well formed.
func (r *contRead) complete(full string) bool {
	return r.text.String() == full && len(r.ids) == 1 && r.finish == 1 && r.done
}

// readContinued sends question as a streamed chat completion and reads
// its answer.
func readContinued(ctx context.Context, client *http.Client, url, model, question string) *contRead {
	r := &contRead{ids: map[string]bool{}}
	body, _ := json.Marshal(map[string]any{
		"model":          model,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
		"messages":       []chatMessage{{Role: "user", Content: question}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.err = fmt.Errorf("status %s", resp.Status)
		return r
	}
	br := bufio.NewReader(resp.Body)
	var data []string // the data lines of the event read now
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err != io.EOF {
				r.err = err
			}
			return r
		}
		line = strings.TrimRight(line, "\r\n")
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(d, " "))
			continue
		}
		if line != "" || len(data) == 0 {
			continue
		}
		r.event(strings.Join(data, "\n"))
		data = data[:0]
	}
}

// event reads one event's data.
func (r *contRead) event(data string) {
	if data == "[DONE]" {
		r.done = true
		return
	}
	var chunk struct {
		ID      string `json:"id"`
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(data), &chunk) != nil {
		r.ids["(not JSON)"] = true
		return
	}
	r.ids[chunk.ID] = true
	for _, c := range chunk.Choices {
		if c.Delta.Content != "" {
			r.text.WriteString(c.Delta.Content)
			r.times = append(r.times, time.Now())
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			r.finish++
		}
	}
}

// contServer is a local OpenAI chat-completions server that streams, to
// each question, answerTo(question) a word a chunk. As a primary, it
// breaks the stream after contCutAfter chunks as its fault says. As a
// backup, it continues: it reads the trailing assistant message of the
// request (the answer so far) and streams the rest of the answer after
// it, then a usage chunk; a prefix that is not the answer's gets the
// whole answer again, which the caller reads as wrong. In the refused
// rows it answers a continuation 400, as a model that refuses prefill
// does.
type contServer struct {
	o      contOptions
	fault  contFault
	backup bool
	srv    *httptest.Server
	fresh  atomic.Int64 // requests with no answer so far
}

func newContServer(o contOptions, f contFault, backup bool) *contServer {
	s := &contServer{o: o, fault: f, backup: backup}
	s.srv = httptest.NewServer(s)
	return s
}

func (s *contServer) baseURL() string { return s.srv.URL + "/v1" }

func (s *contServer) close() { s.srv.Close() }

func (s *contServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string        `json:"model"`
		Messages []chatMessage `json:"messages"`
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no route "+r.URL.Path)
		return
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "the body is not a chat request")
		return
	}
	msgs, prefix := req.Messages, ""
	if last := msgs[len(msgs)-1]; last.Role == "assistant" {
		msgs, prefix = msgs[:len(msgs)-1], last.Content
	}
	question := ""
	for _, m := range msgs {
		if m.Role == "user" {
			question = m.Content
		}
	}
	full := answerTo(question)
	if prefix == "" {
		s.fresh.Add(1)
	}
	if !s.backup {
		s.breakAfter(w, r, req.Model, words(full)[:contCutAfter])
		return
	}
	if prefix != "" && s.fault == contRefused {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request_error",
			"This model does not support assistant message prefill. The conversation must end with a user message.")
		return
	}
	rest := full
	if strings.HasPrefix(full, prefix) {
		rest = full[len(prefix):]
	}
	var prompt int64
	for _, m := range req.Messages {
		prompt += tokens(m.Content)
	}
	s.stream(w, r, req.Model, words(rest), tokens(rest), prompt)
}

// chunk is one chat.completion.chunk event.
func contChunk(id, model, delta, finish string) string {
	return fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
		id, model, delta, finish)
}

func contentDelta(text string) string {
	b, _ := json.Marshal(map[string]string{"content": text})
	return string(b)
}

// breakAfter streams the role and chunks, a chunk gap apart, then breaks
// as the primary's fault says: it stays silent until the request ends,
// or, a chunk gap after the last chunk, ends the stream or drops the
// connection.
func (s *contServer) breakAfter(w http.ResponseWriter, r *http.Request, model string, chunks []string) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	if !wait(ctx, s.o.scaled(contFirst)) {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, contChunk("chatcmpl-primary", model, `{"role":"assistant","content":""}`, "null"))
	for i, c := range chunks {
		if i > 0 && !wait(ctx, s.o.scaled(contChunkGap)) {
			return
		}
		io.WriteString(w, contChunk("chatcmpl-primary", model, contentDelta(c), "null"))
		if rc.Flush() != nil {
			return
		}
	}
	switch {
	case s.fault == contStall:
		<-ctx.Done()
	case !wait(ctx, s.o.scaled(contChunkGap)):
	case s.fault == contEnd:
		// The handler returns: the server ends the chunked body
		// cleanly, and the caller reads io.EOF.
	default:
		panic(http.ErrAbortHandler) // the connection drops mid-stream
	}
}

// stream streams the role and chunks, a chunk gap apart, then the finish
// reason, the usage and [DONE].
func (s *contServer) stream(w http.ResponseWriter, r *http.Request, model string, chunks []string, completion, prompt int64) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	if !wait(ctx, s.o.scaled(contBackupFirst)) {
		return
	}
	const id = "chatcmpl-backup"
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, contChunk(id, model, `{"role":"assistant","content":""}`, "null"))
	for i, c := range chunks {
		if i > 0 && !wait(ctx, s.o.scaled(contChunkGap)) {
			return
		}
		io.WriteString(w, contChunk(id, model, contentDelta(c), "null"))
		if rc.Flush() != nil {
			return
		}
	}
	io.WriteString(w, contChunk(id, model, `{}`, `"stop"`))
	fmt.Fprintf(w, `data: {"id":%q,"object":"chat.completion.chunk","created":1,"model":%q,"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n",
		id, model, prompt, completion, prompt+completion)
	io.WriteString(w, "data: [DONE]\n\n")
	rc.Flush()
}

// writeContinue writes the continuation part's table and its summary.
func writeContinue(out io.Writer, o contOptions, rows []contRow) error {
	var b strings.Builder
	head := fmt.Sprintf("Stream continuation: %d OpenAI chat streams a row, %d at once, through a failover.Transport over a primary "+
		"and a backup that continues a trailing assistant message (Prefill ChatTrailingAssistant), with Config.Continue on and off; "+
		"the rows play at once. The primary sends %d words of a %d-byte answer, a chunk each %s, then: "+
		"cut drops the connection; stall goes silent (the primary's Timeouts.Idle %s); "+
		"early end ends the stream with no finish reason or [DONE]; "+
		"refused drops the connection and the backup answers the continuation 400, as a model that refuses prefill does. "+
		"The backup streams the rest of the answer after the prefix it was sent (%s to its first chunk). "+
		"Times at provider scale. Config is the default but for Continue, the primary's Breaker.FailureThreshold (1000: "+
		"every stream breaks there) and Idle, Retry.BudgetMin (%d) and Hang.Off.",
		o.Streams, o.Parallel, contCutAfter, contAnswer, fmtDur(contChunkGap), fmtDur(contIdle), fmtDur(contBackupFirst), o.Parallel)
	wrap(&b, head, lineWidth)
	b.WriteString("\n")
	g := grid{
		{"", "read", "ended in error", "ended like a", "continued", "time added"},
		{"", "complete", "original / other", "success, short", "/ not", "p50 / p99"},
	}
	for _, r := range rows {
		cont, added := "-", "-"
		if r.On {
			cont = fmt.Sprintf("%d / %d", r.Continued, r.NotContinued)
		}
		if r.Continued > 0 {
			added = fmtDur(r.Added50) + " / " + fmtDur(r.Added99)
		}
		g = append(g, []string{r.Name(), fmt.Sprint(r.Complete), fmt.Sprintf("%d / %d", r.Original, r.Other), fmt.Sprint(r.Short), cont, added})
	}
	g.write(&b, lineWidth)
	notes := "\nRead complete: the whole answer, one id, one finish reason and [DONE]. The original error: " +
		"io.ErrUnexpectedEOF for a cut, failover.ErrStreamStalled for a stall, failover.ErrStreamTruncated for an early end. " +
		"Time added: the caller's wait at the break, less the chunk gap an unbroken stream waits there or, for a stall, less Idle; " +
		fmt.Sprintf("on this machine at this timescale, the backup's first chunk (%s) included.", fmtDur(o.scaled(contBackupFirst)))
	for _, r := range rows {
		if r.Other > 0 {
			notes += fmt.Sprintf("\n%s: the first other error: %s", r.Name(), r.OtherErr)
		}
		if r.On && r.NotContinued > 0 {
			notes += fmt.Sprintf("\n%s: not continued, as the Trace says: %s", r.Name(), r.NotWhy)
		}
		if r.FirstAtBackup > 0 {
			notes += fmt.Sprintf("\n%s: %d streams began on the backup, not the primary.", r.Name(), r.FirstAtBackup)
		}
	}
	wrap(&b, notes+"\n\n"+contSummary(rows), lineWidth)
	_, err := io.WriteString(out, b.String())
	return err
}

// contSummary says in plain words what the continuation part showed.
func contSummary(rows []contRow) string {
	var on, off, refused contRow // the sums of the rows that can be continued, on and off; the refused row, on
	var added50, added99 time.Duration
	for _, r := range rows {
		switch {
		case r.Fault == contRefused:
			if r.On {
				refused = r
			}
			continue
		case r.On:
			added50, added99 = max(added50, r.Added50), max(added99, r.Added99)
			on.add(r)
		default:
			off.add(r)
		}
	}
	s := fmt.Sprintf("In short: of %d streams cut, stalled or ended early after their content began, the caller read %d complete "+
		"with continuation on, at most %s p50 and %s p99 later than unbroken, and %d ended like a success with a short answer; "+
		"with it off, %d of %d were complete and %d ended like a success with a short answer.",
		on.Streams, on.Complete, fmtDur(added50), fmtDur(added99), on.Short, off.Complete, off.Streams, off.Short)
	if refused.Streams > 0 {
		s += fmt.Sprintf(" Where the backup refused the continuation, %d of %d streams ended in the primary's own error "+
			"(io.ErrUnexpectedEOF), %d in another error, %d like a success.", refused.Original, refused.Streams, refused.Other, refused.Short)
	}
	return s
}

// add adds r's counts to s.
func (s *contRow) add(r contRow) {
	s.Streams += r.Streams
	s.Complete += r.Complete
	s.Original += r.Original
	s.Other += r.Other
	s.Short += r.Short
}
