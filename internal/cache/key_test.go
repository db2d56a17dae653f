package cache

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// checkKey fails t unless key is a legal memcached key.
func checkKey(t *testing.T, key string) {
	t.Helper()
	if len(key) > 250 {
		t.Errorf("key %q is %d bytes, want ≤ 250", key, len(key))
	}
	for i := 0; i < len(key); i++ {
		if b := key[i]; b <= ' ' || b == 0x7f {
			t.Errorf("key %q has illegal byte %#x at %d", key, b, i)
		}
	}
	if !strings.HasPrefix(key, keyPrefix) {
		t.Errorf("key %q lacks prefix %q", key, keyPrefix)
	}
}

// Tests that any URI, however hostile, maps to a legal, distinct key.
func TestKeyIsAlwaysLegal(t *testing.T) {
	tests := []struct {
		name, uri string
	}{
		{name: "ordinary", uri: "at://did:plc:abc/app.bsky.feed.post/3k2a"},
		{name: "empty", uri: ""},
		{name: "spaces", uri: "at://did:plc:a b/app.bsky.feed.post/x y"},
		{name: "CRLF command", uri: "x\r\nflush_all\r\n"},
		{name: "get command", uri: "get foo"},
		{name: "NUL and DEL", uri: "a\x00b\x7fc"},
		{name: "non-UTF-8", uri: "\xff\xfe\xfd"},
		{name: "20 kB", uri: strings.Repeat("a", 20<<10)},
		{name: "longer than a key", uri: strings.Repeat("é", 300)},
	}
	seen := map[string]string{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := Key(tc.uri)
			checkKey(t, key)
			if key != Key(tc.uri) {
				t.Errorf("Key(%q) is not deterministic", tc.uri)
			}
			if other, ok := seen[key]; ok {
				t.Errorf("Key(%q) = Key(%q) = %q", tc.uri, other, key)
			}
			seen[key] = tc.uri
		})
	}
}

// FuzzKey checks that keys are legal, deterministic, and distinct for
// distinct URIs.
func FuzzKey(f *testing.F) {
	f.Add("at://did:plc:abc/app.bsky.feed.post/3k2a", "at://did:plc:abc/app.bsky.feed.post/3k2b")
	f.Add("get x", "get x\r\n")
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := Key(a), Key(b)
		checkKey(t, ka)
		checkKey(t, kb)
		if ka != Key(a) {
			t.Fatalf("Key(%q) is not deterministic", a)
		}
		if (a == b) != (ka == kb) {
			t.Fatalf("Key(%q) = %q, Key(%q) = %q", a, ka, b, kb)
		}
	})
}

// Tests that adding a fifth server to four moves about a fifth of the
// keys, and that keys spread evenly.
func TestRendezvousRemapsAFifth(t *testing.T) {
	four := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211"}
	five := append(append([]string(nil), four...), "10.0.0.5:11211")
	s4, s5 := seedsFor(four), seedsFor(five)
	const n = 10000
	moved := 0
	load := make([]int, len(five))
	for i := range n {
		key := Key(fmt.Sprintf("at://did:plc:u%d/app.bsky.feed.post/%d", i%97, i))
		before, after := pick(s4, key), pick(s5, key)
		if before != after {
			moved++
			if after != 4 {
				t.Fatalf("key %s moved from server %d to %d, not to the new server", key, before, after)
			}
		}
		load[after]++
	}
	if frac := float64(moved) / n; frac < 0.15 || frac > 0.25 {
		t.Errorf("moved %.3f of keys, want between 0.15 and 0.25", frac)
	}
	for i, l := range load {
		if dev := math.Abs(float64(l)-n/5) / (n / 5); dev > 0.1 {
			t.Errorf("server %d holds %d keys, more than 10%% off an even %d", i, l, n/5)
		}
	}
}

// Tests that while one of three servers is out, only its keys move, that
// they spread over both others, and that with every server out a key
// stays on its own server.
func TestRendezvousMovesOnlyTheOutServersKeys(t *testing.T) {
	seeds := seedsFor([]string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"})
	const out, n = 1, 9000
	live := func(i int) bool { return i != out }
	none := func(int) bool { return false }
	moved := make([]int, len(seeds))
	for i := range n {
		key := Key(fmt.Sprintf("at://did:plc:u%d/app.bsky.feed.post/%d", i%89, i))
		home, now := pick(seeds, key), pickLive(seeds, key, live)
		switch {
		case home != out && now != home:
			t.Fatalf("key %s on live server %d moved to %d", key, home, now)
		case home == out && now == out:
			t.Fatalf("key %s stayed on the out server", key)
		case home == out:
			moved[now]++
		}
		if got := pickLive(seeds, key, none); got != home {
			t.Fatalf("with every server out, key %s went to %d, want its own %d", key, got, home)
		}
	}
	total := moved[0] + moved[2]
	if frac := float64(total) / n; frac < 0.28 || frac > 0.39 {
		t.Errorf("%.3f of keys moved, want about a third", frac)
	}
	if lo := min(moved[0], moved[2]); float64(lo) < 0.4*float64(total) {
		t.Errorf("moved keys split %d / %d between the live servers, want about even", moved[0], moved[2])
	}
}
