package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

var (
	plainColor = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	// failoverColors are the failover runs' lines, in order.
	failoverColors = []color.Color{
		color.RGBA{R: 31, G: 119, B: 180, A: 255},
		color.RGBA{R: 44, G: 160, B: 44, A: 255},
		color.RGBA{R: 255, G: 127, B: 14, A: 255},
		color.RGBA{R: 148, G: 103, B: 189, A: 255},
		color.RGBA{R: 23, G: 190, B: 207, A: 255},
		color.RGBA{R: 127, G: 127, B: 127, A: 255},
	}
	upstreamFill = []color.Color{
		color.RGBA{R: 31, G: 119, B: 180, A: 255},
		color.RGBA{R: 44, G: 160, B: 44, A: 255},
		color.RGBA{R: 255, G: 127, B: 14, A: 255},
		color.RGBA{R: 148, G: 103, B: 189, A: 255},
		color.RGBA{R: 140, G: 86, B: 75, A: 255},
	}
	faultShade = map[fault]color.Color{
		burst503:    color.RGBA{R: 255, G: 224, B: 224, A: 255},
		hang:        color.RGBA{R: 232, G: 232, B: 232, A: 255},
		storm429:    color.RGBA{R: 255, G: 240, B: 200, A: 255},
		overload529: color.RGBA{R: 240, G: 224, B: 255, A: 255},
	}
)

// bins are the requests of one run grouped by when they were due.
type bins struct {
	width    time.Duration
	success  plotter.XYs // percent, at bin centers
	p99      plotter.XYs // milliseconds, at bin centers
	attempts [][]float64 // [upstream][bin] attempts per second
	n        int         // number of bins
}

// binWidth is a second, or less for a drill too short for 30 of them.
func binWidth(d time.Duration) time.Duration {
	return min(time.Second, max(d/30, 10*time.Millisecond))
}

func binRun(r *run, d, width time.Duration) bins {
	records, attempts := r.snapshot()
	n := int((d + width - 1) / width)
	b := bins{width: width, n: n, attempts: make([][]float64, len(r.names))}
	ok := make([]int, n)
	all := make([]int, n)
	lat := make([][]time.Duration, n)
	for _, rec := range records {
		i := min(int(rec.start/width), n-1)
		all[i]++
		if rec.ok {
			ok[i]++
		}
		lat[i] = append(lat[i], rec.latency)
	}
	perSec := float64(time.Second) / float64(width)
	for u := range b.attempts {
		b.attempts[u] = make([]float64, n)
	}
	for _, a := range attempts {
		if i := int(a.at / width); i >= 0 && i < n {
			b.attempts[a.upstream][i] += perSec
		}
	}
	for i := range n {
		if all[i] == 0 {
			continue
		}
		x := (float64(i) + 0.5) * width.Seconds()
		b.success = append(b.success, plotter.XY{X: x, Y: 100 * ratio(ok[i], all[i])})
		slices.Sort(lat[i])
		b.p99 = append(b.p99, plotter.XY{X: x, Y: max(float64(percentile(lat[i], 0.99))/float64(time.Millisecond), 0.1)})
	}
	return b
}

// writePlot draws the drill to path, a .png or .svg file: the callers'
// success rate and p99 over time with the faults shaded, and for each
// failover run its attempts per upstream, stacked.
func writePlot(path string, o options, phases []phase, runs []*run, rep *report) error {
	format := plotFormat(path)
	if format == "" {
		return fmt.Errorf("-plot %s: want a .png or .svg file", path)
	}
	width := binWidth(o.Duration)
	per := "per second"
	if width != time.Second {
		per = "per " + width.Round(time.Millisecond).String()
	}
	binned := make([]bins, len(runs))
	for i, r := range runs {
		binned[i] = binRun(r, o.Duration, width)
	}
	lineColor := func(i int) color.Color {
		if i == 0 {
			return plainColor
		}
		return failoverColors[(i-1)%len(failoverColors)]
	}
	lineName := func(i int) string {
		if i == 0 {
			return "plain client"
		}
		return runs[i].name
	}
	xmax := o.Duration.Seconds()

	// Success rate, each run's retention in the legend.
	ps := newPanel(fmt.Sprintf("What the caller saw: success rate %s  (legend: retention over the run)", per), xmax)
	ps.Y.Label.Text = "success %"
	ps.Y.Min, ps.Y.Max = 0, 118
	ps.Y.Tick.Marker = plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 25, Label: "25"}, {Value: 50, Label: "50"}, {Value: 75, Label: "75"}, {Value: 100, Label: "100"}}
	ps.Add(&shading{phases: phases, labels: true})
	for i, b := range binned {
		addLine(ps, b.success, lineColor(i), fmt.Sprintf("%s  %.2f %%", lineName(i), 100*rep.Runs[i].Retention))
	}
	ps.Legend.Left = true
	ps.Legend.Padding = vg.Points(3)
	ps.Legend.XOffs, ps.Legend.YOffs = vg.Points(8), vg.Points(8)

	// p99.
	pl := newPanel(fmt.Sprintf("End-to-end p99 latency %s, log scale  (legend: p99 over the run)", per), xmax)
	pl.Y.Label.Text = "p99 (ms)"
	pl.Y.Scale = plot.LogScale{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lo, hi := math.Inf(1), 0.0
	for _, b := range binned {
		for _, xy := range b.p99 {
			lo, hi = math.Min(lo, xy.Y), math.Max(hi, xy.Y)
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	pl.Y.Min, pl.Y.Max = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi*1.5)))
	pl.Add(&shading{phases: phases})
	for i, b := range binned {
		addLine(pl, b.p99, lineColor(i), fmt.Sprintf("%s  %s", lineName(i), fmtDur(time.Duration(rep.Runs[i].Latency.P99*float64(time.Second)))))
	}
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Legend.Padding = vg.Points(3)
	pl.Legend.XOffs, pl.Legend.YOffs = vg.Points(8), -vg.Points(4)

	panels := [][]*plot.Plot{{ps}, {pl}}
	for i := 1; i < len(runs); i++ {
		pa, err := attemptsPanel(runs[i], binned[i], rep.Runs[i], phases, o, width)
		if err != nil {
			return err
		}
		panels = append(panels, []*plot.Plot{pa})
	}
	panels[len(panels)-1][0].X.Label.Text = fmt.Sprintf("time (s); %g req/s per run, timescale %g", o.RPS, o.Timescale)

	// 10 inches for the three panels of a drill with one failover run,
	// 3 more for each further one.
	c, err := draw.NewFormattedCanvas(11*vg.Inch, vg.Length(10+3*(len(panels)-3))*vg.Inch, format)
	if err != nil {
		return err
	}
	canvases := plot.Align(panels, draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(14)}, draw.New(c))
	for i, row := range panels {
		row[0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// attemptsPanel draws a failover run's attempts to each upstream over
// time, stacked.
func attemptsPanel(r *run, b bins, rr runReport, phases []phase, o options, width time.Duration) (*plot.Plot, error) {
	xmax := o.Duration.Seconds()
	title := "Failover run"
	switch {
	case r.spec.fleet > 0:
		title = fmt.Sprintf("%s%s (%d members, all their requests)", strings.ToUpper(r.name[:1]), r.name[1:], r.spec.fleet)
	case r.name != "failover":
		title = strings.ToUpper(r.name[:1]) + r.name[1:] + " run"
	}
	pa := newPanel(title+": requests sent to each upstream, stacked (req/s)", xmax)
	pa.Y.Label.Text = "req/s"
	pa.Add(&shading{phases: phases})
	cum := make([]float64, b.n)
	tops := make([][]float64, len(b.attempts))
	for u, counts := range b.attempts {
		for i, c := range counts {
			cum[i] += c
		}
		tops[u] = slices.Clone(cum)
	}
	// Draw from the top of the stack down, each upstream's area from zero
	// to its cumulative top, so each covers the part of the one above it
	// that is not its own.
	for u := len(tops) - 1; u >= 0; u-- {
		xys := make(plotter.XYs, 0, b.n+1)
		for i, y := range tops[u] {
			xys = append(xys, plotter.XY{X: float64(i) * width.Seconds(), Y: y})
		}
		xys = append(xys, plotter.XY{X: math.Min(float64(b.n)*width.Seconds(), xmax), Y: tops[u][b.n-1]})
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.StepStyle = plotter.PostStep
		l.FillColor = upstreamFill[u%len(upstreamFill)]
		l.LineStyle.Width = 0
		pa.Add(l)
	}
	for u, name := range r.names {
		swatch, _ := plotter.NewPolygon(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 0}, {X: 1, Y: 1}})
		swatch.Color = upstreamFill[u%len(upstreamFill)]
		swatch.LineStyle.Width = 0
		pa.Legend.Add(fmt.Sprintf("%s (%d)", name, rr.PerUpstream[u].Attempts), swatch)
	}
	pa.Y.Min, pa.Y.Max = 0, o.RPS*1.45
	pa.Y.Tick.Marker = niceTicks{}
	pa.Legend.Top = true
	pa.Legend.Padding = vg.Points(3)
	pa.Legend.XOffs, pa.Legend.YOffs = -vg.Points(8), -vg.Points(4)
	return pa, nil
}

// plotFormat returns "png" or "svg" from path's extension, or "".
func plotFormat(path string) string {
	switch f := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), "."); f {
	case "png", "svg":
		return f
	}
	return ""
}

func newPanel(title string, xmax float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Min, p.X.Max = 0, xmax
	p.X.Label.Text = "time (s)"
	p.Add(plotter.NewGrid())
	return p
}

func addLine(p *plot.Plot, xys plotter.XYs, c color.Color, name string) {
	if len(xys) == 0 {
		return
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return
	}
	l.Color = c
	l.Width = vg.Points(1.6)
	p.Add(l)
	p.Legend.Add(name, l)
}

// shading is a plot.Plotter that shades the fault windows across the whole
// height of a panel, and names them along its top when labels is set.
type shading struct {
	phases []phase
	labels bool
}

func (s *shading) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	sty := draw.TextStyle{
		Color:   color.Gray{Y: 60},
		Font:    p.Title.TextStyle.Font,
		XAlign:  draw.XCenter,
		YAlign:  draw.YTop,
		Handler: p.Title.TextStyle.Handler,
	}
	sty.Font.Size = vg.Points(9)
	for _, ph := range s.phases {
		if ph.fault == healthy {
			continue
		}
		x0, x1 := trX(ph.start.Seconds()), trX(ph.end.Seconds())
		c.FillPolygon(faultShade[ph.fault], []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
		if s.labels {
			c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: c.Max.Y - vg.Points(3)}, ph.name)
		}
	}
}

// niceTicks labels an axis from zero at steps of 1, 2 or 5 times a power of
// ten, about five of them, without decimals that say nothing.
type niceTicks struct{}

func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
}
