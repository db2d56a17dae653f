package report

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

//go:embed report.html.tmpl
var htmlSource string

var htmlPage = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":    fmtMS,
	"codes": Codes,
	"num":   func(v float64) string { return fmt.Sprintf("%.0f", v) },
}).Parse(htmlSource))

// palette colours the clients' lines, in order.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// series is one line of a chart.
type series struct {
	Name   string
	Colour string
	XY     [][2]float64
}

// htmlData is what the template renders.
type htmlData struct {
	R       *Report
	Charts  []template.HTML
	Colours map[string]string
	Vitals  []vitalRow
}

type vitalRow struct{ Name, First, Peak, Last, Source string }

// WriteHTML writes a self-contained page — no scripts, fonts or images
// from elsewhere — with the per-client table, latency-over-time and
// items/s-over-time charts per client as inline SVG, and the server's
// vital signs over time.
func WriteHTML(w io.Writer, r *Report) error {
	d := htmlData{R: r, Colours: map[string]string{}}
	var p99, p50, items []series
	for i, c := range r.Clients {
		colour := palette[i%len(palette)]
		d.Colours[c.Name] = colour
		s50, s99, sItems := series{Name: c.Name, Colour: colour}, series{Name: c.Name, Colour: colour}, series{Name: c.Name, Colour: colour}
		for _, pt := range c.Timeline {
			x := float64(pt.Second)
			if pt.OK+pt.Errors > 0 {
				s50.XY = append(s50.XY, [2]float64{x, pt.P50})
				s99.XY = append(s99.XY, [2]float64{x, pt.P99})
			}
			sItems.XY = append(sItems.XY, [2]float64{x, float64(pt.Items)})
		}
		p50, p99, items = append(p50, s50), append(p99, s99), append(items, sItems)
	}
	d.Charts = append(d.Charts,
		chart("p99 latency per second (ms, log scale; from the scheduled send time)", p99, true),
		chart("p50 latency per second (ms, log scale)", p50, true),
		chart("items answered per second", items, false))
	if v := r.Vitals; v != nil {
		for _, f := range figures {
			d.Vitals = append(d.Vitals, vitalRow{f.name, orUnknown(f, f.get(v.First)), orUnknown(f, f.get(v.Peak)), orUnknown(f, f.get(v.Last)), orDash(v.Sources[f.key])})
			var s series
			s.Name, s.Colour = f.name, "#444"
			for _, smp := range v.Samples {
				if y := f.get(smp); y >= 0 {
					s.XY = append(s.XY, [2]float64{smp.Seconds, y})
				}
			}
			if len(s.XY) > 0 {
				d.Charts = append(d.Charts, chart("server: "+f.name, []series{s}, false))
			}
		}
	}
	if err := htmlPage.Execute(w, d); err != nil {
		return fmt.Errorf("report: render HTML: %w", err)
	}
	return nil
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 900.0, 260.0
	padL, padR     = 70.0, 150.0
	padT, padB     = 28.0, 30.0
)

// chart draws series as an SVG line chart with a legend; logY plots
// log10(y) (values ≤ 0.001 are clamped).
func chart(title string, ss []series, logY bool) template.HTML {
	xmax, ymin, ymax := 1.0, math.Inf(1), math.Inf(-1)
	tf := func(y float64) float64 {
		if logY {
			return math.Log10(max(y, 0.001))
		}
		return y
	}
	for _, s := range ss {
		for _, p := range s.XY {
			xmax = max(xmax, p[0])
			ymin, ymax = min(ymin, tf(p[1])), max(ymax, tf(p[1]))
		}
	}
	if math.IsInf(ymin, 0) {
		ymin, ymax = 0, 1
	}
	if !logY {
		ymin = 0
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	px := func(x float64) float64 { return padL + x/xmax*(chartW-padL-padR) }
	py := func(y float64) float64 { return chartH - padB - (tf(y)-ymin)/(ymax-ymin)*(chartH-padT-padB) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img">`, chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<text x="%.0f" y="18" class="title">%s</text>`, padL, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" class="frame"/>`, padL, padT, chartW-padL-padR, chartH-padT-padB)
	for i := 0; i <= 4; i++ {
		yv := ymin + (ymax-ymin)*float64(i)/4
		label := yv
		if logY {
			label = math.Pow(10, yv)
		}
		y := chartH - padB - float64(i)/4*(chartH-padT-padB)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" class="grid"/><text x="%.0f" y="%.1f" class="axis" text-anchor="end">%s</text>`,
			padL, chartW-padR, y, y, padL-6, y+4, axisLabel(label))
	}
	for i := 0; i <= 5; i++ {
		xv := xmax * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" class="axis" text-anchor="middle">%.0fs</text>`, px(xv), chartH-10, xv)
	}
	for i, s := range ss {
		if len(s.XY) == 0 {
			continue
		}
		var pts []string
		for _, p := range s.XY {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`, s.Colour, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="3" fill="%s"/><text x="%.0f" y="%.0f" class="legend">%s</text>`,
			chartW-padR+10, padT+float64(i)*16+4, s.Colour, chartW-padR+26, padT+float64(i)*16+9, template.HTMLEscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and escaped names only
}

func axisLabel(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2g", v)
}
