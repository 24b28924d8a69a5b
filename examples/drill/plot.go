package main

import (
	"fmt"
	"image/color"
	"math"
	"math/bits"
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

// bins are the requests of one run grouped by when they were due, into n
// bins of equal width: bin i is [i·d/n, (i+1)·d/n) of a drill of length d.
type bins struct {
	n     int     // number of bins
	width float64 // of a bin, in seconds

	// success is the percentage of the bin's requests that succeeded,
	// okP99 the p99 of the successful ones and failedP99 that of the
	// failed ones, in milliseconds, each present only when the bin has
	// requests of its kind.
	success, okP99, failedP99 []maybe

	// okOverall is the p99 of every successful request of the run, and
	// failed the number of failed ones.
	okOverall time.Duration
	failed    int

	attempts [][]float64 // [upstream][bin] attempts per second
}

// maybe is a bin's value, or nothing when the bin has none.
type maybe struct {
	y  float64
	ok bool
}

// binCount returns how many bins a drill of length d is cut into: 30 times
// the smallest k that makes a bin a second or shorter, so that each fault
// phase (whole thirtieths of d, see script) begins and ends on the edge
// of a bin and its shading covers exactly its bins.
func binCount(d time.Duration) int {
	k := (d/30 + time.Second - 1) / time.Second
	return 30 * int(max(k, 1))
}

// binOf returns the bin of n, over a drill of length d, that holds t: the
// last bin i whose start, floor(i·d/n) as script rounds a phase's, is not
// after t. That is floor(((t+1)·n − 1)/d), computed without overflow, and
// clamped to the bins.
func binOf(t, d time.Duration, n int) int {
	if t <= 0 || d <= 0 {
		return 0
	}
	if t >= d {
		return n - 1
	}
	hi, lo := bits.Mul64(uint64(t)+1, uint64(n))
	lo, borrow := bits.Sub64(lo, 1, 0)
	hi -= borrow
	q, _ := bits.Div64(hi, lo, uint64(d)) // hi < d, since t < d
	return min(int(q), n-1)
}

func binRun(r *run, d time.Duration, n int) bins {
	records, attempts := r.snapshot()
	b := bins{n: n, width: d.Seconds() / float64(n), attempts: make([][]float64, len(r.names))}
	okLat := make([][]time.Duration, n)
	failedLat := make([][]time.Duration, n)
	var allOK []time.Duration
	for _, rec := range records {
		i := binOf(rec.start, d, n)
		if rec.ok {
			okLat[i] = append(okLat[i], rec.latency)
			allOK = append(allOK, rec.latency)
		} else {
			failedLat[i] = append(failedLat[i], rec.latency)
			b.failed++
		}
	}
	slices.Sort(allOK)
	b.okOverall = percentile(allOK, 0.99)
	perSec := 1 / b.width
	for u := range b.attempts {
		b.attempts[u] = make([]float64, n)
	}
	for _, a := range attempts {
		if a.at >= 0 && a.at < d {
			b.attempts[a.upstream][binOf(a.at, d, n)] += perSec
		}
	}
	p99 := func(lat []time.Duration) maybe {
		if len(lat) == 0 {
			return maybe{}
		}
		slices.Sort(lat)
		return maybe{y: max(float64(percentile(lat, 0.99))/float64(time.Millisecond), 0.1), ok: true}
	}
	b.success = make([]maybe, n)
	b.okP99 = make([]maybe, n)
	b.failedP99 = make([]maybe, n)
	for i := range n {
		if all := len(okLat[i]) + len(failedLat[i]); all > 0 {
			b.success[i] = maybe{y: 100 * ratio(len(okLat[i]), all), ok: true}
		}
		b.okP99[i] = p99(okLat[i])
		b.failedP99[i] = p99(failedLat[i])
	}
	return b
}

// writePlot draws the drill to path, a .png or .svg file: the callers'
// success rate and the p99 of their successful requests over time, the
// p99 of the failed ones marked apart, with the faults shaded; and for
// each failover run its attempts per upstream, stacked. Each bin's figure
// is drawn across the whole of its bin, whose edges the phases' edges
// fall on (binCount).
func writePlot(path string, o options, phases []phase, runs []*run, rep *report) error {
	format := plotFormat(path)
	if format == "" {
		return fmt.Errorf("-plot %s: want a .png or .svg file", path)
	}
	n := binCount(o.Duration)
	binned := make([]bins, len(runs))
	for i, r := range runs {
		binned[i] = binRun(r, o.Duration, n)
	}
	per := "per second"
	if w := o.Duration / time.Duration(n); w != time.Second {
		per = "per " + w.Round(time.Millisecond).String()
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

	// Success rate, each run's retention in the legend. The axis ends at
	// 100 %: there is nothing above it.
	ps := newPanel(fmt.Sprintf("What the caller saw: success rate %s  (legend: retention over the run)", per), xmax)
	ps.Y.Label.Text = "success %"
	ps.Y.Min, ps.Y.Max = 0, 100
	ps.Y.Tick.Marker = plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 25, Label: "25"}, {Value: 50, Label: "50"}, {Value: 75, Label: "75"}, {Value: 100, Label: "100"}}
	ps.Add(&shading{phases: phases, labels: true})
	for i, b := range binned {
		if err := addSteps(ps, b.success, b.width, lineColor(i), fmt.Sprintf("%s  %.2f %%", lineName(i), 100*rep.Runs[i].Retention)); err != nil {
			return err
		}
	}
	ps.Legend.Left = true
	ps.Legend.Padding = vg.Points(3)
	ps.Legend.XOffs, ps.Legend.YOffs = vg.Points(8), vg.Points(8)

	// Latency: of the successful requests, as steps; of the failed ones
	// apart, as crosses. A failure is often fast (a 503 answers at once),
	// and mixed in with the successes it would pull the p99 down just
	// when the caller is worst off.
	pl := newPanel(fmt.Sprintf("End-to-end p99 latency %s, log scale: lines for successful requests only, × for failed ones  (legend: over the run)", per), xmax)
	pl.Y.Label.Text = "p99 (ms)"
	pl.Y.Scale = plot.LogScale{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lo, hi := math.Inf(1), 0.0
	for _, b := range binned {
		for _, ys := range [][]maybe{b.okP99, b.failedP99} {
			for _, m := range ys {
				if m.ok {
					lo, hi = math.Min(lo, m.y), math.Max(hi, m.y)
				}
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	pl.Y.Min, pl.Y.Max = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi*1.5)))
	pl.Add(&shading{phases: phases})
	for i, b := range binned {
		if err := addSteps(pl, b.okP99, b.width, lineColor(i), fmt.Sprintf("%s, successes  %s", lineName(i), fmtDur(b.okOverall))); err != nil {
			return err
		}
	}
	for i, b := range binned {
		if b.failed == 0 {
			continue
		}
		if err := addCrosses(pl, b.failedP99, b.width, lineColor(i), fmt.Sprintf("%s, failed: %d requests", lineName(i), b.failed)); err != nil {
			return err
		}
	}
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Legend.Padding = vg.Points(3)
	pl.Legend.XOffs, pl.Legend.YOffs = vg.Points(8), -vg.Points(4)

	panels := [][]*plot.Plot{{ps}, {pl}}
	for i := 1; i < len(runs); i++ {
		pa, err := attemptsPanel(runs[i], binned[i], rep.Runs[i], phases, o)
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
func attemptsPanel(r *run, b bins, rr runReport, phases []phase, o options) (*plot.Plot, error) {
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
			xys = append(xys, plotter.XY{X: float64(i) * b.width, Y: y})
		}
		xys = append(xys, plotter.XY{X: xmax, Y: tops[u][b.n-1]})
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

// addSteps draws a bin's value across the whole of its bin, with a break
// wherever a bin has none, and names the line in the legend.
func addSteps(p *plot.Plot, ys []maybe, width float64, c color.Color, name string) error {
	var first *plotter.Line
	for i := 0; i < len(ys); {
		if !ys[i].ok {
			i++
			continue
		}
		var xys plotter.XYs
		for ; i < len(ys) && ys[i].ok; i++ {
			xys = append(xys, plotter.XY{X: float64(i) * width, Y: ys[i].y})
		}
		xys = append(xys, plotter.XY{X: float64(i) * width, Y: xys[len(xys)-1].Y})
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.StepStyle = plotter.PostStep
		l.Color = c
		l.Width = vg.Points(1.6)
		p.Add(l)
		if first == nil {
			first = l
		}
	}
	if first != nil {
		p.Legend.Add(name, first)
	}
	return nil
}

// addCrosses marks each bin's value with a cross at the bin's middle, and
// names the marks in the legend.
func addCrosses(p *plot.Plot, ys []maybe, width float64, c color.Color, name string) error {
	var xys plotter.XYs
	for i, m := range ys {
		if m.ok {
			xys = append(xys, plotter.XY{X: (float64(i) + 0.5) * width, Y: m.y})
		}
	}
	if len(xys) == 0 {
		return nil
	}
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	sc.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(3.5), Shape: draw.CrossGlyph{}}
	p.Add(sc)
	p.Legend.Add(name, sc)
	return nil
}

// shading is a plot.Plotter that shades the fault windows across the whole
// height of a panel, and names them when labels is set, at 60 % of its
// height: in a fault the plain client is at the bottom of the success
// panel and the failover runs at its top.
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
		YAlign:  draw.YCenter,
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
			c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: c.Min.Y + 0.6*(c.Max.Y-c.Min.Y)}, ph.name)
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
