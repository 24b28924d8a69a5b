// Package sse reads server-sent event streams (text/event-stream) as their
// bytes come, by the rules of the WHATWG HTML standard's "Server-sent
// events" section.
package sse

import (
	"bytes"
	"time"
)

// Kind is what [Reader.Next] found.
type Kind uint8

const (
	// None means that nothing more can be read from the stream fed so
	// far.
	None Kind = iota
	// Comment is a comment line, one that begins with a colon.
	Comment
	// Event is the end of an event: [Reader.Type] and [Reader.Data] say
	// what it is.
	Event
	// Part is a piece of the data of an event larger than the Reader
	// holds (see [Reader.Buffer]), in [Reader.Data].
	Part
)

// DefaultMax is the most data of one event a Reader holds, unless
// [Reader.Buffer] says otherwise.
const DefaultMax = 64 << 10

// A Reader splits an event stream into comments and events. It is fed the
// stream in pieces of any size: after each [Reader.Feed], [Reader.Next]
// returns what the piece completes, until it returns [None]. [Reader.End]
// marks the end of the stream.
//
// Lines end in CRLF, LF or CR; a byte order mark at the start of the
// stream is dropped; a blank line ends an event; the values of an event's
// "data" lines are joined with LF; "event", "id" and "retry" are read
// too, other fields ignored. As the providers' SDKs read streams, and
// unlike the standard, an event with an "event" field but no data is an
// event too, and the end of the stream ends the last event.
//
// The zero Reader is ready to use. Its memory is bounded: see
// [Reader.Buffer].
type Reader struct {
	chunk  []byte // the piece being read
	at     int    // where in chunk
	after  []byte // the piece to read after chunk, while held bytes are read first
	lf, cr int    // the next LF and CR in chunk at or after at, once looked for

	bom     int  // bytes of a byte order mark read at the start
	started bool // past the byte order mark, or its absence
	crEnd   bool // the last line ended in CR: an LF next is part of it
	eof     bool
	done    bool // the end of the stream has ended the last event

	state   uint8
	field   uint8
	name    [5]byte // the field name read so far; longer names are none of ours
	nameLen int

	max     int
	data    []byte // the event's data held
	hasData bool
	parted  bool // the event's data went out in Parts
	sep     bool // a data line follows another: LF before its value
	typ     text
	sent    bool   // Next returned Event: the event is cleared at the next call
	out     []byte // what Data returns

	id, idNext []byte
	idNUL      bool
	retry      time.Duration
	retryNext  int64
	retryOK    bool
	hasRetry   bool
}

// Where Next is in a line.
const (
	atStart = iota // at the start of a line
	inName         // in a field's name
	atSpace        // after the colon, where a space may come
	inValue        // in the field's value
	inSkip         // in a comment or a line that is ignored
)

// The fields the Reader reads.
const (
	fieldOther = iota
	fieldComment
	fieldData
	fieldEvent
	fieldID
	fieldRetry
)

var (
	bom = []byte("\xEF\xBB\xBF")
	lf  = []byte("\n")
)

// maxRetry bounds a retry field's milliseconds so that a Duration holds them.
const maxRetry = int64(1<<63-1) / int64(time.Millisecond)

// Buffer sets the buffer the Reader first holds an event's data in, and
// max, the most data of one event it holds. The data of a larger event
// goes out in Parts as it comes, the data held first: Next returns [Part]
// for each piece, then [Event] once the event ends. An event type or an id
// is cut to max bytes. Buffer must be called before the first Feed. By
// default the Reader allocates as it needs and holds up to [DefaultMax].
func (r *Reader) Buffer(buf []byte, max int) {
	r.data, r.max = buf[:0], max
}

// Feed gives the Reader the next piece of the stream. The Reader reads p
// in place: p must not change until Next returns [None]. Feed must not be
// called until then, nor after End.
func (r *Reader) Feed(p []byte) {
	if !r.started {
		i := 0
		for i < len(p) && r.bom+i < len(bom) && p[i] == bom[r.bom+i] {
			i++
		}
		switch {
		case r.bom+i == len(bom): // the mark, dropped
			r.started = true
			p = p[i:]
		case i == len(p): // the mark so far: the rest may come next
			r.bom += i
			return
		default: // no mark after all: the bytes held were the stream's
			r.started = true
			if r.bom > 0 {
				r.read(bom[:r.bom])
				r.after = p
				return
			}
		}
	}
	r.read(p)
}

// End tells the Reader that the stream is over: its last line needs no
// line end, its last event no blank line. Next then returns what they
// complete.
func (r *Reader) End() {
	r.eof = true
	if !r.started {
		r.started = true
		r.read(bom[:r.bom])
	}
}

func (r *Reader) read(p []byte) {
	r.chunk, r.at, r.lf, r.cr = p, 0, -1, -1
}

// Type returns the type of the event Next returned: the value of its last
// "event" field, or nothing. It is valid until the next call of Next.
func (r *Reader) Type() []byte { return r.typ.bytes() }

// Data returns the data of the event Next returned (but for the data that
// went out in Parts), or the piece of data a Part is. It is valid until
// the next call of Next.
func (r *Reader) Data() []byte { return r.out }

// LastEventID returns the value of the last "id" field read, or nothing.
// It is valid until the next call of Next.
func (r *Reader) LastEventID() []byte { return r.id }

// Retry returns the reconnection time the last valid "retry" field gave,
// and whether one did.
func (r *Reader) Retry() (time.Duration, bool) { return r.retry, r.hasRetry }

// Next reads what was fed until it completes a comment, an event or a
// Part, and returns what it found; [None] when it needs more of the
// stream.
func (r *Reader) Next() Kind {
	if r.sent {
		r.clearEvent()
	}
	for {
		b := r.chunk
		if r.at == len(b) {
			if r.after != nil {
				r.read(r.after)
				r.after = nil
				continue
			}
			if r.eof && !r.done {
				return r.end()
			}
			return None
		}
		if r.crEnd {
			r.crEnd = false
			if b[r.at] == '\n' {
				r.at++
				continue
			}
		}
		switch r.state {
		case atStart:
			if bytes.HasPrefix(b[r.at:], []byte("data:")) { // the usual line, at once
				r.at += len("data:")
				r.startField(fieldData)
				if r.at < len(b) {
					if b[r.at] == ' ' {
						r.at++
					}
					r.state = inValue
				}
				continue
			}
			switch c := b[r.at]; c {
			case '\n', '\r':
				r.at++
				r.crEnd = c == '\r'
				if r.dispatch() {
					return Event
				}
			case ':':
				r.at++
				r.state, r.field = inSkip, fieldComment
			default:
				r.state, r.nameLen = inName, 0
			}
		case inName:
			for ; r.at < len(b) && r.nameLen <= len(r.name); r.at++ {
				c := b[r.at]
				if c == ':' || c == '\n' || c == '\r' {
					break
				}
				if r.nameLen < len(r.name) {
					r.name[r.nameLen] = c
				}
				r.nameLen++
			}
			switch {
			case r.nameLen > len(r.name):
				r.state, r.field = inSkip, fieldOther
			case r.at < len(b):
				colon := b[r.at] == ':'
				if colon {
					r.at++
				}
				r.startField(r.fieldNamed())
				if !colon && r.state == atSpace {
					r.state = inValue // a line that is a name alone: its value is empty
				}
			}
		case atSpace:
			if b[r.at] == ' ' {
				r.at++
			}
			r.state = inValue
		default: // inValue, inSkip
			end := r.lineEnd()
			if r.state == inValue {
				if k := r.take(end); k != None {
					return k
				}
			}
			r.at = end
			if end == len(b) {
				continue // the line goes on in the next piece
			}
			r.at++
			r.crEnd = b[end] == '\r'
			if r.endLine() {
				return Comment
			}
		}
	}
}

// end ends the last line and the last event at the end of the stream.
func (r *Reader) end() Kind {
	if r.state == inName {
		r.startField(r.fieldNamed())
	}
	if r.state == atSpace {
		r.state = inValue
	}
	if r.state == inValue {
		if k := r.take(r.at); k != None {
			return k
		}
	}
	if r.state != atStart && r.endLine() {
		return Comment
	}
	r.done = true
	if r.dispatch() {
		return Event
	}
	return None
}

// lineEnd returns the index of the next CR or LF in the chunk, or its
// length. Each search passes over bytes no other search passes again, so
// that the work is linear in the chunk however its lines end.
func (r *Reader) lineEnd() int {
	b := r.chunk
	if r.lf < r.at {
		r.lf = indexFrom(b, r.at, '\n')
	}
	if r.cr < r.at {
		r.cr = indexFrom(b, r.at, '\r')
	}
	return min(r.lf, r.cr)
}

func indexFrom(b []byte, at int, c byte) int {
	if i := bytes.IndexByte(b[at:], c); i >= 0 {
		return at + i
	}
	return len(b)
}

func (r *Reader) fieldNamed() uint8 {
	switch string(r.name[:r.nameLen]) {
	case "data":
		return fieldData
	case "event":
		return fieldEvent
	case "id":
		return fieldID
	case "retry":
		return fieldRetry
	}
	return fieldOther
}

// startField begins the value of a field, after its name and colon.
func (r *Reader) startField(f uint8) {
	r.state, r.field = atSpace, f
	switch f {
	case fieldOther:
		r.state = inSkip
	case fieldData:
		r.sep = r.hasData
		r.hasData = true
	case fieldEvent:
		r.typ.reset()
	case fieldID:
		r.idNext, r.idNUL = r.idNext[:0], false
	case fieldRetry:
		r.retryNext, r.retryOK = 0, false
	}
}

// take takes in the value's bytes from at to end. It returns Part when
// data is to go out, and then leaves at where it was if there is more.
func (r *Reader) take(end int) Kind {
	v := r.chunk[r.at:end]
	switch r.field {
	case fieldData:
		if r.sep {
			k, ok := r.addData(lf)
			r.sep = !ok
			if k != None {
				return k
			}
		}
		k, ok := r.addData(v)
		if ok {
			r.at = end
		}
		return k
	case fieldEvent:
		r.typ.add(v, r.limit())
	case fieldID:
		r.idNUL = r.idNUL || bytes.IndexByte(v, 0) >= 0
		r.idNext = append(r.idNext, v[:min(len(v), r.limit()-len(r.idNext))]...)
	case fieldRetry:
		for _, c := range v {
			if c < '0' || c > '9' {
				r.field = fieldOther // not a number: ignored
				break
			}
			r.retryNext = min(10*r.retryNext+int64(c-'0'), maxRetry)
			r.retryOK = true
		}
	}
	r.at = end
	return None
}

// addData adds v to the event's data, and reports whether it did: a Part
// of the data held goes out first when v would make it more than max.
func (r *Reader) addData(v []byte) (Kind, bool) {
	switch {
	case r.parted:
		if len(v) == 0 {
			return None, true
		}
		r.out = v
		return Part, true
	case len(r.data)+len(v) <= r.limit():
		if len(r.data)+len(v) > cap(r.data) {
			r.grow(len(r.data) + len(v))
		}
		r.data = append(r.data, v...)
		return None, true
	}
	r.parted = true
	if len(r.data) > 0 {
		r.out = r.data
		return Part, false
	}
	r.out = v
	return Part, true
}

// grow makes room for n bytes of data, and no more than max.
func (r *Reader) grow(n int) {
	data := make([]byte, len(r.data), min(max(n, 2*cap(r.data), 64), r.limit()))
	copy(data, r.data)
	r.data = data
}

func (r *Reader) limit() int {
	if r.max <= 0 {
		return DefaultMax
	}
	return r.max
}

// endLine ends the line of the field in progress, and reports whether it
// was a comment.
func (r *Reader) endLine() bool {
	r.state = atStart
	switch r.field {
	case fieldComment:
		return true
	case fieldID:
		if !r.idNUL {
			r.id, r.idNext = r.idNext, r.id
		}
	case fieldRetry:
		if r.retryOK {
			r.retry, r.hasRetry = time.Duration(r.retryNext)*time.Millisecond, true
		}
	}
	return false
}

// dispatch ends the event in progress, and reports whether there was one.
func (r *Reader) dispatch() bool {
	if !r.hasData && r.typ.n == 0 {
		return false
	}
	r.out = nil
	if !r.parted {
		r.out = r.data
	}
	r.sent = true
	return true
}

func (r *Reader) clearEvent() {
	r.data, r.out = r.data[:0], nil
	r.hasData, r.parted, r.sep, r.sent = false, false, false, false
	r.typ.reset()
}

// text is an event type: in place while it is short, as they are.
type text struct {
	n     int
	short [64]byte
	long  []byte // when n > len(short)
}

func (t *text) reset() { t.n, t.long = 0, t.long[:0] }

// add appends v, up to max bytes in all.
func (t *text) add(v []byte, max int) {
	v = v[:min(len(v), max-t.n)]
	switch {
	case t.n+len(v) <= len(t.short):
		copy(t.short[t.n:], v)
	case t.n <= len(t.short):
		t.long = append(append(t.long[:0], t.short[:t.n]...), v...)
	default:
		t.long = append(t.long, v...)
	}
	t.n += len(v)
}

func (t *text) bytes() []byte {
	if t.n <= len(t.short) {
		return t.short[:t.n]
	}
	return t.long
}
