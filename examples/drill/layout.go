package main

import (
	"strings"
	"unicode/utf8"
)

// lineWidth is the widest line the drill prints: its output fits a
// terminal of 100 columns.
const lineWidth = 100

// colGap is the space between two columns of a grid.
const colGap = 3

// wrap writes text to b, each of its lines broken at spaces into lines of
// at most width columns, the continuation lines indented two more than
// the line's own indent. A number
// stays on the line of the word after it ("750 ms", "99.8 %"); a single
// word wider than width stands alone on its line.
func wrap(b *strings.Builder, text string, width int) {
	for line := range strings.SplitSeq(text, "\n") {
		n := 0 // columns of the current line
		lead := len(line) - len(strings.TrimLeft(line, " "))
		for i, w := range glue(strings.Fields(line)) {
			lw := utf8.RuneCountInString(w)
			switch {
			case i == 0:
				b.WriteString(line[:lead])
				n = lead
			case n+1+lw > width:
				b.WriteString("\n" + strings.Repeat(" ", lead+2))
				n = lead + 2
			default:
				b.WriteByte(' ')
				n++
			}
			b.WriteString(w)
			n += lw
		}
		b.WriteByte('\n')
	}
}

// glue joins each word that ends in a digit to the word after it, so that
// a figure is never parted from its unit.
func glue(words []string) []string {
	var out []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		for i+1 < len(words) && w[len(w)-1] >= '0' && w[len(w)-1] <= '9' {
			i++
			w += " " + words[i]
		}
		out = append(out, w)
	}
	return out
}

// grid is a table of text: a row's first cell names it, the second is the
// plain run's, each further one a failover run's column.
type grid [][]string

// write writes g to b in blocks of columns: every block has the names and
// the plain run's column, and as many of the failover runs' columns, in
// order, as fit in width (at least one). Columns are left-aligned and
// colGap apart; lines have no trailing spaces.
func (g grid) write(b *strings.Builder, width int) {
	if len(g) == 0 {
		return
	}
	cols := len(g[0])
	w := make([]int, cols)
	for _, row := range g {
		for i, c := range row {
			w[i] = max(w[i], utf8.RuneCountInString(c))
		}
	}
	for first := 2; first == 2 || first < cols; {
		block, used := []int{0, 1}, w[0]+colGap+w[1]
		for last := first; last < cols && (last == first || used+colGap+w[last] <= width); last++ {
			block = append(block, last)
			used += colGap + w[last]
		}
		if first > 2 {
			b.WriteByte('\n')
		}
		for _, row := range g {
			var line strings.Builder
			for _, i := range block {
				line.WriteString(row[i])
				line.WriteString(strings.Repeat(" ", w[i]-utf8.RuneCountInString(row[i])+colGap))
			}
			b.WriteString(strings.TrimRight(line.String(), " "))
			b.WriteByte('\n')
		}
		first += len(block) - 2
		if len(block) == 2 {
			break
		}
	}
}
