package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// maxHogs bounds -hogs.
const maxHogs = 64

// hogEnv, set in its environment, makes the drill's binary (or its test
// binary, through TestMain) a CPU hog instead: see hogMain.
const hogEnv = "FAILOVER_DRILL_HOG"

// hogReady is what a hog writes to its stdout once it spins.
const hogReady = "spinning\n"

// hogMain turns the process into a CPU hog when hogEnv is set, and
// otherwise returns at once: main and TestMain call it first. A hog writes
// hogReady, then spins on one thread until its stdin ends, which happens
// when the drill closes it or exits by any path, a crash or a kill
// included; the drill kills it too.
func hogMain() {
	if os.Getenv(hogEnv) == "" {
		return
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	if _, err := io.WriteString(os.Stdout, hogReady); err != nil {
		os.Exit(1)
	}
	spin()
}

// spinSink keeps spin's work observable.
var spinSink uint64

// spin keeps one CPU busy forever.
func spin() {
	x := uint64(1)
	for {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		spinSink = x
	}
}

// hogs are the CPU hogs of -hogs: child processes, each spinning on one
// thread, that compete with the drill for the CPUs at the OS level, as
// other jobs on the machine do, outside the Go scheduler.
type hogs struct {
	cmds    []*exec.Cmd
	stdin   []io.Closer    // closing one ends its hog
	readers sync.WaitGroup // the goroutines that wait for hogReady
}

// startHogs starts n hogs, each a copy of this binary with hogEnv and
// GOMAXPROCS=1 in its environment, and returns once all of them spin.
// Call stop when done, on every path; should the drill end without it,
// the hogs' stdin ends and they exit.
func startHogs(n int) (*hogs, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("-hogs: %v", err)
	}
	h := &hogs{}
	ready := make(chan error, n)
	for range n {
		if err := h.start(exe, ready); err != nil {
			h.stop()
			return nil, fmt.Errorf("-hogs: %v", err)
		}
	}
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for range n {
		select {
		case err := <-ready:
			if err != nil {
				h.stop()
				return nil, fmt.Errorf("-hogs: %s did not start spinning: %v", exe, err)
			}
		case <-timeout.C:
			h.stop()
			return nil, errors.New("-hogs: the hogs did not start spinning within 10s")
		}
	}
	return h, nil
}

// start starts one hog; its first line, or why there was none, goes to
// ready.
func (h *hogs) start(exe string, ready chan<- error) error {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), hogEnv+"=1", "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		in.Close()
		return err
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close() // the hog has its own copy
	if err != nil {
		in.Close()
		r.Close()
		return err
	}
	h.cmds, h.stdin = append(h.cmds, cmd), append(h.stdin, in)
	h.readers.Go(func() {
		defer r.Close()
		line, err := bufio.NewReader(r).ReadString('\n')
		if err == nil && line != hogReady {
			err = fmt.Errorf("it said %q, want %q", line, hogReady)
		}
		ready <- err
	})
	return nil
}

// stop kills the hogs and waits for them to end.
func (h *hogs) stop() {
	for i, cmd := range h.cmds {
		h.stdin[i].Close()
		cmd.Process.Kill()
	}
	for _, cmd := range h.cmds {
		cmd.Wait()
	}
	h.readers.Wait()
	h.cmds, h.stdin = nil, nil
}
