package cqlstore

import (
	"strings"
	"testing"

	"github.com/gocql/gocql"
)

type fakeHost string

func (h fakeHost) Info() *gocql.HostInfo { return nil }
func (h fakeHost) Mark(error)            {}

// Tests that the iterator offers the inner hosts, then each of them once
// more in the same order, then nothing, and keeps answering nothing.
func TestReplayOnceOffersEachHostTwice(t *testing.T) {
	inner := []gocql.SelectedHost{fakeHost("a"), fakeHost("b")}
	next := replayOnce(func() gocql.SelectedHost {
		if len(inner) == 0 {
			return nil
		}
		h := inner[0]
		inner = inner[1:]
		return h
	})
	var got []string
	for range 7 {
		if h := next(); h != nil {
			got = append(got, string(h.(fakeHost)))
		} else {
			got = append(got, "-")
		}
	}
	if want := "a b a b - - -"; strings.Join(got, " ") != want {
		t.Fatalf("offered %q, want %q", strings.Join(got, " "), want)
	}
}

// Tests that an iterator over no host at all stays empty.
func TestReplayOnceOfNothingIsNothing(t *testing.T) {
	next := replayOnce(func() gocql.SelectedHost { return nil })
	for range 3 {
		if h := next(); h != nil {
			t.Fatalf("offered %v from an empty policy", h)
		}
	}
}
