package failover

// References to state held by a provider: what in a request only the
// upstream that made it can serve, and the id an answer gives to the state
// it made. Pinning reads both.
//
// A ref is a bare id, the same however it is written: an OpenAI or
// Anthropic id as it is ("resp_123", "file-abc"), a Google resource name
// by its last segment ("cachedContents/xyz", a Vertex
// "projects/p/locations/l/cachedContents/xyz" and the path
// "/v1beta/cachedContents/xyz" are all "xyz"; a Gemini fileUri
// ".../v1beta/files/abc" is "abc").

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/failover-go/failover/internal/sse"
	"github.com/tidwall/gjson"
)

// Bounds of reading refs, on input the caller or an upstream controls.
const (
	maxRefs      = 16       // refs one request yields
	maxRefLen    = 256      // bytes of one ref: a longer string is none
	maxRefDepth  = 32       // nesting of a request body walked
	maxRefItems  = 4096     // members and elements of a request body walked
	maxRefScan   = 16 << 10 // bytes of an answer scanned for its id
	refEventHold = 512      // bytes of an event's data held before they go out in Parts
)

// stateRefs appends to dst the references to state held by a provider that a request makes, and
// reports whether it carries such state without any reference (opaque: encrypted reasoning
// content, which only the organisation that made it can read).
// method and path are the request's (path: the part after the upstream's base path, e.g.
// "/responses/resp_123/input_items", "/files/file-abc/content", "/v1beta/cachedContents/xyz";
// the base path may or may not include /v1 — match on segments anywhere in the path). body is the
// JSON request body (nil when unknown / not JSON / too large).
//
// The path names a ref in the segment after a collection of state
// (/responses/{id}, /files/{id}, /threads/{id}/runs/{id}, ...); the body in
// the members the APIs define for them (previous_response_id, file_id,
// vector_store_ids, cachedContent, an item_reference, ...), read from
// parsed JSON, never from the text of a string, and not inside what is the
// caller's own (metadata, labels, schemas, a tool call's arguments). A ref
// is returned once, at most maxRefs of them; the method does not matter.
// A body without any of the names stateRefs reads is not parsed.
func stateRefs(dst []string, method, path string, body []byte) (refs []string, opaque bool) {
	base := len(dst)
	dst = pathRefs(dst, base, path)
	if len(body) == 0 || !mayRefer(body) || !nestsShallow(body) || !gjson.ValidBytes(body) {
		return dst, false
	}
	w := refWalk{dst: dst, base: base}
	// Parsed in place: a ref is cloned before it is kept.
	w.walk(gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body))), 0)
	return w.dst, w.opaque
}

// pathRefs appends the refs path names, and a Google resumable upload's
// upload_id in its query, if it has one.
func pathRefs(dst []string, base int, path string) []string {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		if path[i] == '?' {
			dst = queryRef(dst, base, path[i+1:])
		}
		path = path[:i]
	}
	var prev string
	under := false  // a ref came earlier: its members are refs too
	member := false // the segment is a member of a collection of state
	for path != "" {
		var seg string
		seg, path, _ = strings.Cut(path, "/")
		if seg == "" {
			continue
		}
		name, _, _ := strings.Cut(seg, ":") // a Google custom method: batches/123:cancel
		if member {
			member = false
			if !notMember(name) && validRef(name) {
				dst = appendRef(dst, base, name)
				under, prev = true, name
				continue
			}
		}
		// A model's or an Azure deployment's name is the caller's,
		// whatever it is.
		named := prev == "models" || prev == "deployments"
		member = !named && (stateCollection(name, prev) || under && memberCollection(name))
		prev = name
	}
	return dst
}

// queryRef appends the upload_id of query, the session of a Google
// resumable upload.
func queryRef(dst []string, base int, query string) []string {
	query, _, _ = strings.Cut(query, "#")
	for query != "" {
		var kv string
		kv, query, _ = strings.Cut(query, "&")
		if id, ok := strings.CutPrefix(kv, "upload_id="); ok && validRef(id) {
			return appendRef(dst, base, id)
		}
	}
	return dst
}

// stateCollection reports whether the path segment name, after prev,
// names a collection of state held by the provider, whose members' ids
// are refs.
func stateCollection(name, prev string) bool {
	switch name {
	case "responses", "conversations", "files", "uploads", "batches", "vector_stores",
		"assistants", "threads", "containers", "evals", "videos", "skills",
		"cachedContents", "fileSearchStores", "interactions", "operations":
		return true
	case "completions": // stored chat completions
		return prev == "chat"
	case "calls": // a realtime call, at the provider that took it
		return prev == "realtime"
	case "jobs":
		return prev == "fine_tuning"
	}
	return false
}

// memberCollection reports whether the path segment name names a
// collection within a piece of state (a thread's runs, a run's steps, a
// conversation's items), whose members' ids are refs too.
func memberCollection(name string) bool {
	switch name {
	case "runs", "steps", "messages", "items", "file_batches", "output_items":
		return true
	}
	return false
}

// notMember reports whether a segment after a collection is an endpoint
// of its own rather than a member's id.
func notMember(name string) bool {
	switch name {
	case "input_tokens", "compact", "runs":
		return true
	}
	return false
}

// createsState reports whether a successful answer to method+path creates state that later
// requests may reference by an id in the answer: POST .../responses, .../conversations,
// .../files, .../uploads, .../batches, .../vector_stores, .../assistants, .../threads,
// .../threads/runs, .../messages/batches (Anthropic), .../cachedContents (Gemini),
// .../containers, .../realtime/sessions? (decide), and `store` semantics: an OpenAI Responses
// POST with "store": false creates nothing (so: createsState takes the body too).
//
// Only a POST to a collection of state creates any, and only when no ref
// precedes in the path: what is made within a piece of state (a thread's
// message, a vector store's file) is reached through its parent's ref.
// Besides the collections above: .../fine_tuning/jobs, .../evals,
// .../videos, Anthropic's .../skills, Gemini's .../fileSearchStores,
// .../interactions (unless "store": false) and a model's
// :batchGenerateContent, :asyncBatchEmbedContent or :predictLongRunning
// (an operation), a completed
// .../uploads/{id}/complete (its file), and .../chat/completions with
// "store": true. Realtime sessions and client secrets create none: their
// answer is a short-lived credential, which no later request names (nor
// does a realtime call, whose id is not in a JSON answer).
func createsState(method, path string, body []byte) bool {
	if method != "POST" {
		return false
	}
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	var a [4]string
	return createsAt(path, len(pathRefs(a[:0], 0, path)), body)
}

// createsAt is createsState for a POST to path, without its query, whose
// path names refs references.
func createsAt(path string, refs int, body []byte) bool {
	var seg [3]string // the last three segments, the last first
	for s := range strings.SplitSeq(path, "/") {
		if s != "" {
			seg[2], seg[1], seg[0] = seg[1], seg[0], s
		}
	}
	last, verb, _ := strings.Cut(seg[0], ":")
	switch {
	case verb != "":
		return verb == "batchGenerateContent" || verb == "asyncBatchEmbedContent" || verb == "predictLongRunning"
	case refs > 0:
		return refs == 1 && last == "complete" && seg[2] == "uploads"
	}
	switch last {
	case "responses", "interactions":
		return stored(body, true)
	case "completions":
		return seg[1] == "chat" && stored(body, false)
	case "runs":
		return seg[1] == "threads"
	case "jobs":
		return seg[1] == "fine_tuning"
	case "input_tokens", "compact", "calls": // a realtime call's id is in no JSON answer
		return false
	}
	return stateCollection(last, seg[1])
}

// stored reads the top-level "store" of a request body: whether the
// provider keeps what it makes; def when the body does not say.
func stored(body []byte, def bool) bool {
	if !bytes.Contains(body, []byte(`"store"`)) {
		return def
	}
	switch gjson.GetBytes(body, "store").Type {
	case gjson.True:
		return true
	case gjson.False:
		return false
	}
	return def
}

// mayRefer reports whether body may name state: whether a string in it,
// key or value, is one of the names stateRefs reads. It looks at the bytes
// between every two quotes, without parsing, so that a body that names no
// state costs one pass and nothing else.
func mayRefer(body []byte) bool {
	const longest = 40 // bytes of a name, suffixed ones included
	i := bytes.IndexByte(body, '"')
	for i >= 0 {
		// Most strings of a JSON body are short: look for their end in
		// line, and skip a longer one at once.
		end := min(len(body), i+2+longest)
		s := body[i+1 : end]
		n := 0
		for n < len(s) && s[n] != '"' {
			n++
		}
		j := i + 1 + n
		switch {
		case n < len(s):
			if n >= 5 && refName(s[:n]) {
				return true
			}
		case end == len(body):
			return false
		default:
			k := bytes.IndexByte(body[end:], '"')
			if k < 0 {
				return false
			}
			j = end + k
		}
		i = j
	}
	return false
}

// refName reports whether s is one of the names stateRefs reads.
func refName(s []byte) bool {
	switch string(s) {
	case "previous_response_id", "previous_interaction_id", "conversation", "conversation_id",
		"file_id", "file_ids", "training_file", "validation_file", "vector_store_ids",
		"thread_id", "assistant_id", "container", "prompt", "audio",
		"cachedContent", "cached_content", "fileUri", "file_uri", "fileName", "file_name",
		"fileSearchStoreNames", "file_search_store_names",
		"item_reference", "reasoning", "encrypted_content", "reasoning.encrypted":
		return true
	}
	return bytes.HasSuffix(s, []byte("_file_id")) || bytes.HasSuffix(s, []byte("_file_ids"))
}

// A refWalk collects the refs of a parsed request body.
type refWalk struct {
	dst    []string
	base   int // len(dst) before the request's refs
	items  int // members and elements walked
	opaque bool
}

// walk reads v, at the given depth of nesting.
func (w *refWalk) walk(v gjson.Result, depth int) {
	if depth > maxRefDepth || w.items >= maxRefItems {
		return
	}
	if v.IsArray() {
		v.ForEach(func(_, e gjson.Result) bool {
			w.items++
			w.walk(e, depth+1)
			return w.items < maxRefItems
		})
	} else if v.IsObject() {
		w.object(v, depth)
	}
}

// object reads the members of the object v.
func (w *refWalk) object(v gjson.Result, depth int) {
	var typ, id, skill, data gjson.Result
	encrypted := false
	v.ForEach(func(k, e gjson.Result) bool {
		w.items++
		switch k.Str {
		case "type":
			typ = e
		case "id":
			id = e
		case "skill_id": // an Anthropic skill's: a ref when the skill is "custom"
			skill = e
		case "data":
			data = e
		case "previous_response_id", "previous_interaction_id", "conversation_id", "thread_id", "assistant_id",
			"file_id", "training_file", "validation_file", "cachedContent", "cached_content":
			w.add(e)
		case "file_ids", "vector_store_ids", "fileSearchStoreNames", "file_search_store_names":
			w.addAll(e)
		case "conversation", "container": // an id, or an object with one (and file_ids)
			if e.Type == gjson.String && e.Str != "auto" && e.Str != "none" {
				w.add(e)
			} else if e.IsObject() {
				w.add(e.Get("id"))
				w.walk(e, depth+1)
			}
		case "audio": // a chat turn's earlier audio answer: {"id": "audio_..."}
			w.add(e.Get("id"))
		case "prompt": // a Responses prompt template: {"id": "pmpt_...", "variables": ...}
			if e.IsObject() {
				w.add(e.Get("id"))
				w.walk(e, depth+1)
			}
		case "fileUri", "file_uri":
			w.addGeminiFile(e)
		case "fileName", "file_name": // a Gemini batch's input file
			if strings.HasPrefix(e.Str, "files/") {
				w.add(e)
			}
		case "encrypted_content":
			if e.Type == gjson.String && e.Str != "" {
				encrypted, w.opaque = true, true
			}
		case "metadata", "labels", "parameters", "parametersJsonSchema", "input_schema",
			"schema", "json_schema", "response_schema", "responseSchema", "responseJsonSchema",
			"args", "response", "arguments":
			// The caller's own names and values: metadata, schemas, a
			// tool call's arguments, a function's response.
		case "input":
			if !e.IsObject() { // an object is a tool call's input, the caller's own
				w.walk(e, depth+1)
			}
		default:
			switch {
			case strings.HasSuffix(k.Str, "_file_id"): // input_file_id, ...
				w.add(e)
			case strings.HasSuffix(k.Str, "_file_ids"):
				w.addAll(e)
			default:
				w.walk(e, depth+1)
			}
		}
		return w.items < maxRefItems
	})
	switch typ.Str {
	case "item_reference", "file_id": // a Responses item, an eval's source file
		w.add(id)
	case "reasoning": // a stored reasoning item, unless it carries its content
		if !encrypted {
			w.add(id)
		}
	case "custom":
		w.add(skill)
	case "reasoning.encrypted": // OpenRouter's reasoning_details
		if data.Type == gjson.String && data.Str != "" {
			w.opaque = true
		}
	}
}

// add takes v, when it is a string that is a ref.
func (w *refWalk) add(v gjson.Result) {
	if v.Type != gjson.String {
		return
	}
	s := v.Str
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		s = s[i+1:]
	}
	if validRef(s) && !hasRef(w.dst[w.base:], s) && len(w.dst)-w.base < maxRefs {
		w.dst = append(w.dst, strings.Clone(s)) // s is in the caller's body
	}
}

// addAll takes the strings of the array v that are refs.
func (w *refWalk) addAll(v gjson.Result) {
	if !v.IsArray() {
		return
	}
	v.ForEach(func(_, e gjson.Result) bool {
		w.items++
		w.add(e)
		return w.items < maxRefItems
	})
}

// addGeminiFile takes a Gemini fileUri that names a file of the Gemini
// API (https://generativelanguage.googleapis.com/v1beta/files/abc); other
// URIs (gs://, https://...) name no state of the provider's.
func (w *refWalk) addGeminiFile(v gjson.Result) {
	s, ok := strings.CutPrefix(v.Str, "https://generativelanguage.googleapis.com/")
	if v.Type != gjson.String || !ok {
		return
	}
	if s, ok = strings.CutPrefix(s, "files/"); !ok {
		if _, s, ok = strings.Cut(s, "/files/"); !ok {
			return
		}
	}
	if i := strings.IndexAny(s, "/?#:"); i >= 0 {
		s = s[:i]
	}
	w.add(gjson.Result{Type: gjson.String, Str: s})
}

// appendRef appends ref to dst unless dst[base:] has it or is full.
func appendRef(dst []string, base int, ref string) []string {
	if hasRef(dst[base:], ref) || len(dst)-base >= maxRefs {
		return dst
	}
	return append(dst, ref)
}

func hasRef(refs []string, ref string) bool {
	for _, r := range refs {
		if r == ref {
			return true
		}
	}
	return false
}

// validRef reports whether s can be a ref: 1 to maxRefLen bytes of
// letters, digits and "-_.~:=+@", as the providers' ids are. Text,
// a URL or a path is none.
func validRef(s string) bool {
	if s == "" || len(s) > maxRefLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		switch c {
		case '-', '_', '.', '~', ':', '=', '+', '@':
			continue
		}
		return false
	}
	return s != "." && s != ".."
}

// A refScanner passes an answer's body through unchanged and finds the id of the state it
// created: the top-level "id" of a JSON answer (OpenAI, Anthropic), the top-level "name" of a
// Gemini cachedContents answer ("cachedContents/abc"), or, in a text/event-stream, the id in the
// first event that carries one (Responses API: event "response.created" whose data has
// {"response":{"id":"resp_..."}}). It keeps at most a bounded prefix (e.g. 16 KiB) of the body,
// never the whole stream, calls found(id) at most once, as soon as it knows (for a stream: at
// that event; for JSON: when the top-level id is read or at EOF/Close), and never when the body
// was cut before the id. It must be safe if the caller never reads to EOF (Close).
//
// The id is given as a ref ("cachedContents/abc" is "abc"). A JSON answer
// that wraps a file (OpenAI's completed Upload, Gemini's uploaded file)
// gives the file's "id" or "name", and a run made with its thread
// (.../threads/runs) the thread's "thread_id", at once; any other the
// top-level "id", else a top-level "name" that is a resource name, once
// the answer's object ends, the first maxRefScan bytes are scanned, or the
// body ends or is closed. An event's data gives its "id" or its
// "response"'s. Only the first maxRefScan bytes are scanned, the rest
// only passed on; of them it holds no more than the id being read and the
// first refEventHold bytes of an event's data. A nil body, http.NoBody or
// a nil found gets the body back as it is.
func newRefScanner(body io.ReadCloser, eventStream bool, found func(id string)) io.ReadCloser {
	if body == nil || body == http.NoBody || found == nil {
		return body
	}
	s := &refScanner{rc: body, found: found, sse: eventStream}
	s.peek.stream = eventStream
	if eventStream {
		s.events.Buffer(s.held[:0], len(s.held))
	}
	return s
}

// refScanner is the body newRefScanner returns.
type refScanner struct {
	rc    io.ReadCloser
	found func(string)
	sse   bool
	over  atomic.Bool // done, read without mu

	// mu guards what follows: Close may come from another goroutine
	// than Read's.
	mu     sync.Mutex
	done   bool // found was called, or will never be
	n      int  // bytes scanned
	peek   jsonPeek
	events sse.Reader
	held   [refEventHold]byte
}

func (s *refScanner) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	if s.over.Load() || n == 0 && err == nil {
		return n, err
	}
	var id string
	s.mu.Lock()
	if !s.done {
		if n > 0 {
			id = s.scan(p[:n])
		}
		if !s.done && err != nil {
			id = s.end() // the body is over, at its end or broken
		}
	}
	s.mu.Unlock()
	if id != "" {
		s.found(id)
	}
	return n, err
}

// Close closes the body and reports the id read by then, unless it was
// reported.
func (s *refScanner) Close() error {
	err := s.rc.Close()
	var id string
	s.mu.Lock()
	if !s.done {
		id = s.end()
	}
	s.mu.Unlock()
	if id != "" {
		s.found(id)
	}
	return err
}

// scan reads p, the next bytes of the body, and returns the id once it
// is known; it sets done when it returns one or nothing more is scanned.
// It requires that mu is held.
func (s *refScanner) scan(p []byte) string {
	if len(p) > maxRefScan-s.n {
		p = p[:maxRefScan-s.n]
	}
	s.n += len(p)
	var id string
	if s.sse {
		s.events.Feed(p)
		id = s.nextEvents()
	} else if s.peek.feed(p) {
		id = s.peek.best()
		s.finish()
	}
	if id == "" && !s.done && s.n == maxRefScan {
		return s.end()
	}
	return id
}

// nextEvents reads the events the stream fed so far completes, and
// returns the first id their data give. It requires that mu is held.
func (s *refScanner) nextEvents() string {
	for {
		k := s.events.Next()
		switch k {
		case sse.None:
			return ""
		case sse.Part, sse.Event:
			s.peek.feed(s.events.Data())
		default:
			continue
		}
		if id := s.peek.best(); id != "" {
			s.finish()
			return id
		}
		if k == sse.Event {
			s.peek = jsonPeek{stream: true}
		}
	}
}

// end ends the scan, at the end of the body, its break, its Close or the
// bound of its bytes, and returns the id read complete by then. It
// requires that mu is held.
func (s *refScanner) end() string {
	var id string
	if s.sse {
		s.events.End()
		id = s.nextEvents()
	} else {
		id = s.peek.best()
	}
	s.finish()
	return id
}

// finish marks the scan done. It requires that mu is held.
func (s *refScanner) finish() {
	s.done = true
	s.over.Store(true)
}

// A jsonPeek reads a JSON value as its bytes come, for the id of the
// state an answer made, holding none of it but that id. It reads strings
// and structure only, so it reads invalid JSON too, to no harm.
type jsonPeek struct {
	stream bool // an event's data: any "id" or "response"'s "id", at once

	depth int
	str   bool // in a string
	esc   bool // after a backslash in a string
	key   bool // the string is a member's name
	cand  uint8
	obj   [3]bool  // the value open at depth 1, 2 is an object
	inKey [3]bool  // a member's name comes next at depth 1, 2
	names [3]uint8 // the name of the member being read at depth 1, 2
	ended bool     // the value ended

	buf [maxRefLen]byte // the string being read, when it is a name or a candidate
	n   int
	bad bool // the string is too long, or escaped: neither a name nor an id

	id    [maxRefLen]byte // the best candidate read complete
	idN   int
	idPri uint8 // what it is: candNone when none was read
}

// Member names a jsonPeek knows.
const (
	nameOther uint8 = iota
	nameID
	nameName
	nameFile
	nameResponse
	nameThread
)

// Candidates, the better last.
const (
	candNone     uint8 = iota
	candName           // top-level "name"
	candID             // top-level "id"
	candThread         // top-level "thread_id": a run's, made with its thread
	candFile           // "file"'s "id" or "name"
	candResponse       // "response"'s "id"
)

// feed reads p and reports whether the value has ended.
func (j *jsonPeek) feed(p []byte) bool {
	for _, c := range p {
		if j.ended {
			return true
		}
		if j.str {
			switch {
			case j.esc:
				j.esc, j.bad = false, true
			case c == '\\':
				j.esc = true
			case c == '"':
				j.str = false
				j.endString()
			case j.key || j.cand != candNone:
				if j.n < len(j.buf) {
					j.buf[j.n] = c
					j.n++
				} else {
					j.bad = true
				}
			}
			continue
		}
		switch c {
		case '"':
			j.str, j.n, j.bad, j.cand = true, 0, false, candNone
			d := j.depth
			j.key = d >= 1 && d <= 2 && j.obj[d] && j.inKey[d]
			if !j.key && d >= 1 && d <= 2 && j.obj[d] {
				j.cand = j.candidate(d)
			}
		case '{', '[':
			j.depth++
			if d := j.depth; d <= 2 {
				j.obj[d], j.inKey[d], j.names[d] = c == '{', c == '{', nameOther
			}
		case '}', ']':
			j.depth--
			if j.depth <= 0 {
				j.ended = true
			}
		case ':':
			if d := j.depth; d >= 1 && d <= 2 {
				j.inKey[d] = false
			}
		case ',':
			if d := j.depth; d >= 1 && d <= 2 && j.obj[d] {
				j.inKey[d] = true
			}
		}
	}
	return j.ended
}

// candidate says what a string value at depth d would be.
func (j *jsonPeek) candidate(d int) uint8 {
	switch {
	case d == 1 && j.names[1] == nameID:
		return candID
	case d == 1 && j.names[1] == nameName && !j.stream:
		return candName
	case d == 1 && j.names[1] == nameThread && !j.stream:
		return candThread
	case d == 2 && j.names[1] == nameFile && !j.stream && (j.names[2] == nameID || j.names[2] == nameName):
		return candFile
	case d == 2 && j.names[1] == nameResponse && j.stream && j.names[2] == nameID:
		return candResponse
	}
	return candNone
}

// endString takes in the string just read.
func (j *jsonPeek) endString() {
	s := j.buf[:j.n]
	if j.key {
		name := nameOther
		if !j.bad {
			switch string(s) {
			case "id":
				name = nameID
			case "name":
				name = nameName
			case "file":
				name = nameFile
			case "response":
				name = nameResponse
			case "thread_id":
				name = nameThread
			}
		}
		j.names[j.depth] = name
		return
	}
	if j.cand == candNone || j.bad || j.cand <= j.idPri {
		return
	}
	if j.cand == candName && bytes.IndexByte(s, '/') < 0 {
		return // a name, not a resource name
	}
	j.idN = copy(j.id[:], s)
	j.idPri = j.cand
	if j.stream || j.cand >= candThread {
		j.ended = true // nothing better can come
	}
}

// best returns the best id read complete so far, as a ref, or "".
func (j *jsonPeek) best() string {
	if j.idPri == candNone {
		return ""
	}
	s := j.id[:j.idN]
	if i := bytes.LastIndexByte(s, '/'); i >= 0 {
		s = s[i+1:]
	}
	if !validRef(unsafe.String(unsafe.SliceData(s), len(s))) {
		return ""
	}
	return string(s)
}
