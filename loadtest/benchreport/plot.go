package benchreport

import (
	"bytes"
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Charts are drawn with gonum.org/v1/plot and written as SVG (fonts not
// embedded: the viewer's sans-serif is used).

// Series is one named line of a LineChart; points with a non-positive or
// NaN coordinate on a log axis are left out.
type Series struct {
	Name   string
	X, Y   []float64
	Points bool // markers only, no line
}

// Ref is a named reference value drawn as a dashed line across the chart
// (a target, a reference system's number).
type Ref struct {
	Name  string
	Value float64
}

// LineChart is y against x, one line per series.
type LineChart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	Series                []Series
	Refs                  []Ref // horizontal lines at y = Value
}

// BarChart is one bar per category and group, side by side.
type BarChart struct {
	Title, ValueLabel string
	Categories        []string
	Groups            []BarGroup
	Refs              []Ref // lines at value = Ref.Value
	Horizontal        bool  // bars to the right, categories down the Y axis
}

// BarGroup is one named set of bars, one value per category (NaN: no bar).
type BarGroup struct {
	Name   string
	Values []float64
}

// DotChart is one marker per category and series, on a value axis from Min
// to Max: for values that all sit in a narrow band (percentages near 100).
type DotChart struct {
	Title, ValueLabel string
	Categories        []string
	Series            []BarGroup
	Min, Max          float64
}

const chartW, chartH = 16 * vg.Centimeter, 9 * vg.Centimeter

// figure is a plot and its legend, drawn below the plot rather than over the data.
type figure struct {
	*plot.Plot
	legend  plot.Legend
	entries int
}

func sans(size vg.Length) font.Font {
	return font.Font{Typeface: "Liberation", Variant: "Sans", Size: size}
}

func newPlot(title, x, y string) *figure {
	p := plot.New()
	p.Title.Text, p.Title.TextStyle.Font = title, sans(12)
	p.X.Label.Text, p.X.Label.TextStyle.Font, p.X.Tick.Label.Font = x, sans(10), sans(9)
	p.Y.Label.Text, p.Y.Label.TextStyle.Font, p.Y.Tick.Label.Font = y, sans(10), sans(9)
	p.Add(plotter.NewGrid())
	l := plot.NewLegend()
	l.TextStyle.Font = sans(9)
	l.Top, l.Left = true, true
	return &figure{Plot: p, legend: l}
}

func (f *figure) addLegend(name string, thumbs ...plot.Thumbnailer) {
	f.legend.Add(name, thumbs...)
	f.entries++
}

func (f *figure) svg() ([]byte, error) {
	legendH := vg.Length(f.entries)*f.legend.TextStyle.Font.Size*1.35 + vg.Points(6)
	if f.entries == 0 {
		legendH = 0
	}
	c := vgsvg.New(chartW, chartH+legendH)
	dc := draw.New(c)
	f.Draw(draw.Crop(dc, 0, 0, legendH, 0))
	if f.entries > 0 {
		area := draw.Crop(dc, vg.Points(40), 0, 0, -chartH)
		f.legend.Draw(area)
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, fmt.Errorf("svg: %w", err)
	}
	return b.Bytes(), nil
}

func usable(v float64, log bool) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!log || v > 0)
}

func refLine(name string, i int, pts plotter.XYs) (*plotter.Line, error) {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, fmt.Errorf("reference %s: %w", name, err)
	}
	l.Color = refColor(i)
	l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	l.Width = vg.Points(1.2)
	return l, nil
}

func refColor(i int) color.Color {
	return []color.Color{color.RGBA{R: 200, A: 255}, color.RGBA{R: 110, G: 110, B: 110, A: 255}, color.RGBA{R: 150, G: 60, B: 200, A: 255}}[i%3]
}

// SVG renders the chart.
func (c LineChart) SVG() ([]byte, error) {
	p := newPlot(c.Title, c.XLabel, c.YLabel)
	if c.LogX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if c.LogY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for i, s := range c.Series {
		var pts plotter.XYs
		for j := range s.X {
			if usable(s.X[j], c.LogX) && usable(s.Y[j], c.LogY) {
				pts = append(pts, plotter.XY{X: s.X[j], Y: s.Y[j]})
				xmin, xmax = min(xmin, s.X[j]), max(xmax, s.X[j])
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, fmt.Errorf("series %s: %w", s.Name, err)
		}
		sc.Color, sc.Shape = plotutil.Color(i), plotutil.Shape(i)
		sc.Radius = vg.Points(3)
		if s.Points {
			p.Add(sc)
			p.addLegend(s.Name, sc)
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("series %s: %w", s.Name, err)
		}
		l.Color, l.Width = plotutil.Color(i), vg.Points(1.5)
		p.Add(l, sc)
		p.addLegend(s.Name, l, sc)
	}
	if math.IsInf(xmin, 1) {
		return nil, fmt.Errorf("chart %q: no data", c.Title)
	}
	if xmin == xmax {
		xmin, xmax = xmin/2, xmax*2
	}
	for i, r := range c.Refs {
		if !usable(r.Value, c.LogY) {
			continue
		}
		l, err := refLine(r.Name, i, plotter.XYs{{X: xmin, Y: r.Value}, {X: xmax, Y: r.Value}})
		if err != nil {
			return nil, err
		}
		p.Add(l)
		p.addLegend(r.Name, l)
	}
	return p.svg()
}

// SVG renders the chart.
func (c BarChart) SVG() ([]byte, error) {
	p := newPlot(c.Title, "", "")
	if c.Horizontal {
		p.X.Label.Text = c.ValueLabel
	} else {
		p.Y.Label.Text = c.ValueLabel
	}
	n := len(c.Groups)
	width := vg.Points(math.Min(30, 150/float64(max(1, n*len(c.Categories))))) // a category's bars fit its slot
	any := false
	for i, g := range c.Groups {
		vals := make(plotter.Values, len(c.Categories))
		for j := range vals {
			if j < len(g.Values) && usable(g.Values[j], false) {
				vals[j] = g.Values[j]
				any = true
			}
		}
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, fmt.Errorf("bars %s: %w", g.Name, err)
		}
		b.Horizontal = c.Horizontal
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = width * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(b)
		if n > 1 || g.Name != "" {
			p.addLegend(g.Name, b)
		}
	}
	if !any {
		return nil, fmt.Errorf("chart %q: no data", c.Title)
	}
	lo, hi := -0.5, float64(len(c.Categories))-0.5
	for i, r := range c.Refs {
		if !usable(r.Value, false) {
			continue
		}
		pts := plotter.XYs{{X: lo, Y: r.Value}, {X: hi, Y: r.Value}}
		if c.Horizontal {
			pts = plotter.XYs{{X: r.Value, Y: lo}, {X: r.Value, Y: hi}}
		}
		l, err := refLine(r.Name, i, pts)
		if err != nil {
			return nil, err
		}
		p.Add(l)
		p.addLegend(r.Name, l)
	}
	if c.Horizontal {
		p.NominalY(c.Categories...)
		p.X.Min = 0
	} else {
		p.NominalX(c.Categories...)
		p.Y.Min = 0
	}
	return p.svg()
}

// SVG renders the chart.
func (c DotChart) SVG() ([]byte, error) {
	p := newPlot(c.Title, "", c.ValueLabel)
	any := false
	for i, s := range c.Series {
		var pts plotter.XYs
		for j, v := range s.Values {
			if j < len(c.Categories) && usable(v, false) {
				pts = append(pts, plotter.XY{X: float64(j), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		any = true
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, fmt.Errorf("series %s: %w", s.Name, err)
		}
		sc.Color, sc.Shape, sc.Radius = plotutil.Color(i), []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.TriangleGlyph{}}[i%3], vg.Points(5)
		p.Add(sc)
		p.addLegend(s.Name, sc)
	}
	if !any {
		return nil, fmt.Errorf("chart %q: no data", c.Title)
	}
	p.NominalX(c.Categories...)
	p.X.Min, p.X.Max = -0.5, float64(len(c.Categories))-0.5
	p.Y.Min, p.Y.Max = c.Min, c.Max
	return p.svg()
}
