package cqlstore

import (
	"strings"
	"testing"

	"github.com/gocql/gocql"
)

type fakeHost string

func (h fakeHost) Info() *gocql.HostInfo { return nil }
func (h fakeHost) Mark(error)            {}

// listOf is an iterator over hosts, as a policy's Pick returns.
func listOf(hosts ...string) gocql.NextHost {
	return func() gocql.SelectedHost {
		if len(hosts) == 0 {
			return nil
		}
		h := fakeHost(hosts[0])
		hosts = hosts[1:]
		return h
	}
}

// drain calls next n times and spells what it offered, "-" for nil.
func drain(next gocql.NextHost, n int) string {
	var got []string
	for range n {
		if h := next(); h != nil {
			got = append(got, string(h.(fakeHost)))
		} else {
			got = append(got, "-")
		}
	}
	return strings.Join(got, " ")
}

// Tests that the iterator offers the inner hosts, then the same hosts in
// the same order for the remaining passes, then nothing for good; and
// that an iterator over no host stays empty.
func TestReplayOffersEachHostOncePerPass(t *testing.T) {
	for _, tc := range []struct {
		hosts  []string
		rounds int
		want   string
	}{
		{[]string{"a", "b"}, 2, "a b a b - - -"},
		{[]string{"a"}, 4, "a a a a - - -"},
		{nil, 4, "- - - - - - -"},
	} {
		if got := drain(replay(listOf(tc.hosts...), tc.rounds), 7); got != tc.want {
			t.Errorf("replay(%v, %d) offered %q, want %q", tc.hosts, tc.rounds, got, tc.want)
		}
	}
}

// onePolicy is a host-selection policy whose Pick offers one node.
type onePolicy struct{ gocql.HostSelectionPolicy }

func (onePolicy) Pick(gocql.ExecutableQuery) gocql.NextHost { return listOf("a") }

// Tests that only idempotent statements get the further passes.
func TestPickReplaysOnlyIdempotentStatements(t *testing.T) {
	p := watchedPolicy{HostSelectionPolicy: onePolicy{}, rounds: 3}
	if got := drain(p.Pick(new(gocql.Query).Idempotent(true)), 4); got != "a a a -" {
		t.Errorf("idempotent statement: offered %q, want %q", got, "a a a -")
	}
	if got := drain(p.Pick(new(gocql.Query)), 4); got != "a - - -" {
		t.Errorf("statement not idempotent: offered %q, want %q", got, "a - - -")
	}
}

// panickyPolicy offers one host, then panics, as a driver fault in host
// selection would.
type panickyPolicy struct{ gocql.HostSelectionPolicy }

func (panickyPolicy) Pick(gocql.ExecutableQuery) gocql.NextHost {
	hosts := listOf("a")
	return func() gocql.SelectedHost {
		if h := hosts(); h != nil {
			return h
		}
		panic("host selection fault")
	}
}

// Tests that a panic in the inner policy's iterator ends the iteration
// instead of the process: gocql calls it on goroutines of its own, which
// no recover of the store's covers.
func TestPickIteratorNeverPanics(t *testing.T) {
	p := watchedPolicy{HostSelectionPolicy: panickyPolicy{}, rounds: 2}
	for name, q := range map[string]gocql.ExecutableQuery{
		"idempotent":     new(gocql.Query).Idempotent(true),
		"not idempotent": new(gocql.Query),
	} {
		var got string
		done := make(chan any, 1)
		go func() { // as gocql's speculative attempt calls it
			defer func() { done <- recover() }()
			got = drain(p.Pick(q), 4)
		}()
		if r := <-done; r != nil {
			t.Fatalf("%s: the iterator panicked: %v", name, r)
		}
		if want := map[string]string{"idempotent": "a a - -", "not idempotent": "a - - -"}[name]; got != want {
			t.Errorf("%s: offered %q, want %q", name, got, want)
		}
	}
}
