package faults

import (
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"
)

// goroutineSlack allows for gRPC's and the HTTP client's idle-connection
// goroutines coming and going.
const goroutineSlack = 4

// driverPackage is the CQL driver's, and driverSlack how many more
// goroutines it may run after a fault than before: it redials after a
// fault, and may still be filling its pool then (connectMany, fill), which
// counted against goroutineSlack left CI runs that passed at exactly that
// slack. A leaked session, whose driver runs 26 goroutines here, still
// shows.
const (
	driverPackage = "github.com/gocql/gocql"
	driverSlack   = 8
)

// proxyPackage is the in-process toxiproxy's. Its goroutines are not
// counted: it runs several per proxied connection, and how many
// connections a driver holds after a fault is bounded by the driver's
// pool, whose own goroutines are counted. Left in, one more CQL
// connection after healing read as a leak of four.
const proxyPackage = "github.com/Shopify/toxiproxy/"

var createdBy = regexp.MustCompile(`\ncreated by (\S+)`)

// goroutineCensus counts the process's goroutines by the function that
// started them ("" for the main and runtime-started ones), leaving out
// the proxy's.
type goroutineCensus map[string]int

func takeCensus() goroutineCensus {
	// The toxiproxy client's HTTP keep-alive connections (a reader and a
	// writer here, a handler in its API server) are the test's, not
	// sluice's: closed first, they are not counted as growth.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	c := goroutineCensus{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		creator := ""
		if m := createdBy.FindStringSubmatch(g); m != nil {
			creator = m[1]
		}
		if !strings.HasPrefix(creator, proxyPackage) {
			c[creator]++
		}
	}
	return c
}

func (c goroutineCensus) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// grownSince lists the creators with more goroutines than in before.
func (c goroutineCensus) grownSince(before goroutineCensus) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if c[k] > before[k] {
			out = append(out, fmt.Sprintf("%s %d→%d", creatorName(k), before[k], c[k]))
		}
	}
	return strings.Join(out, ", ")
}

func creatorName(creator string) string {
	if creator == "" {
		return "(main)"
	}
	return creator
}

// stableCensus returns the census once the count stops falling.
func stableCensus() goroutineCensus {
	c := takeCensus()
	for range 20 {
		time.Sleep(25 * time.Millisecond)
		next := takeCensus()
		if next.total() >= c.total() {
			return next
		}
		c = next
	}
	return c
}

// leakWait waits up to within for the count to return to base's (plus
// slack) and returns the last census.
func leakWait(base goroutineCensus, within time.Duration) goroutineCensus {
	c := takeCensus()
	for end := time.Now().Add(within); time.Now().Before(end) && c.grewPast(base); c = takeCensus() {
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// grewPast reports whether c holds more goroutines than base beyond the
// slack: goroutineSlack for all but the driver's, driverSlack for those.
func (c goroutineCensus) grewPast(base goroutineCensus) bool {
	driver, others := c.split()
	baseDriver, baseOthers := base.split()
	return others > baseOthers+goroutineSlack || driver > baseDriver+driverSlack
}

// split counts the driver's goroutines and the others.
func (c goroutineCensus) split() (driver, others int) {
	for creator, n := range c {
		if strings.HasPrefix(creator, driverPackage) {
			driver += n
		} else {
			others += n
		}
	}
	return driver, others
}
