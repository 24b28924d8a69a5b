package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDefaultPlot checks that the picture a plain run draws goes where any
// checkout can write, the temporary directory, as a PNG.
func TestDefaultPlot(t *testing.T) {
	p := defaultPlot()
	if filepath.Dir(p) != filepath.Clean(os.TempDir()) || plotFormat(p) != "png" {
		t.Errorf("default -plot %q, want a .png file in %s", p, os.TempDir())
	}
}
