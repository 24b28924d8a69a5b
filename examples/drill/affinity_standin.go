package main

// STAND-IN until failover.AffinityConfig lands on main; delete then.

import (
	"bytes"
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"sync"

	"github.com/failover-go/failover"
)

func setAffinity(cfg *failover.Config, off bool) {
	if !off {
		cfg.Base = &stickyBase{next: cfg.Base, hosts: map[uint64]string{}}
	}
}

type stickyBase struct {
	next  http.RoundTripper
	mu    sync.Mutex
	hosts map[uint64]string
}

func (s *stickyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	req.Body.Close()
	var r struct{ Messages []chatMessage }
	json.Unmarshal(body, &r)
	h := fnv.New64a()
	for _, m := range r.Messages[:min(2, len(r.Messages))] {
		writeMessage(h, m)
	}
	k := h.Sum64()
	s.mu.Lock()
	host, ok := s.hosts[k]
	if !ok {
		s.hosts[k] = req.URL.Host
		host = req.URL.Host
	}
	s.mu.Unlock()
	out := req.Clone(req.Context())
	out.URL.Host, out.Host = host, ""
	out.Body = io.NopCloser(bytes.NewReader(body))
	return s.next.RoundTrip(out)
}
