package membudget

import (
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Bytes
	}{{"512MiB", 512 << 20}, {"2GiB", 2 << 30}, {"64KiB", 64 << 10}, {"1048576", 1 << 20}, {" 3 GiB ", 3 << 30}, {"100B", 100}} {
		got, err := ParseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "512MB", "1.5GiB", "-1MiB", "lots", "99999999999TiB"} {
		if _, err := ParseBytes(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseBytes(%q): err %v, want an error quoting it", bad, err)
		}
	}
	if s := (512 * MiB).String(); s != "512MiB" {
		t.Errorf("String() = %q", s)
	}
}

// Tests that a ledger refuses what does not fit, the caller's share
// before the total, gives back on release (once, however often Release
// is called) and forgets callers that hold nothing.
func TestLedgerSharesAndCap(t *testing.T) {
	l := NewLedger("request bytes", 100, 60)
	a1, r := l.Reserve("a", 50)
	if r != nil {
		t.Fatal(r)
	}
	if _, r := l.Reserve("a", 20); r == nil || !r.PerCaller || r.Held != 50 || r.Cap != 60 {
		t.Fatalf("a over its share: %+v, want a per-caller refusal", r)
	}
	b1, r := l.Reserve("b", 45)
	if r != nil {
		t.Fatal(r)
	}
	_, r = l.Reserve("c", 10)
	if r == nil || r.PerCaller || r.Held != 95 || r.Cap != 100 {
		t.Fatalf("c over the total: %+v, want a process-wide refusal", r)
	}
	if !strings.Contains(r.Error(), "95B of the process-wide cap of 100B") {
		t.Errorf("refusal says %q", r.Error())
	}
	a1.Release()
	a1.Release()
	if st := l.Stats(); st.Held != 45 || st.Callers != 1 || st.Peak != 95 || st.RefusedCaller != 1 || st.RefusedTotal != 1 {
		t.Errorf("after release: %+v", st)
	}
	if _, r := l.Reserve("c", 55); r != nil {
		t.Errorf("c after a released: %v", r)
	}
	b1.Release()
	if h := l.Held("b"); h != 0 {
		t.Errorf("b holds %d after release", h)
	}
}

// Tests that a reservation grows within its caller's share and the cap,
// is refused past either without changing what it holds, gives back
// everything it grew to on Release, and gives back at once what is grown
// after Release.
func TestReservationGrows(t *testing.T) {
	l := NewLedger("answers", 100, 60)
	r, refusal := l.Reserve("a", 0)
	if refusal != nil {
		t.Fatal(refusal)
	}
	for range 3 {
		if refusal := r.Grow(20); refusal != nil {
			t.Fatalf("growing to %v of a 60 share: %v", r.Size()+20, refusal)
		}
	}
	if refusal := r.Grow(1); refusal == nil || !refusal.PerCaller {
		t.Fatalf("growing past the share: %v, want a per-caller refusal", refusal)
	}
	other, _ := l.Reserve("b", 40)
	if r.Size() != 60 || l.Held("a") != 60 || l.Stats().Held != 100 {
		t.Fatalf("after a refused growth: reservation %v, caller %v, ledger %v; want 60, 60, 100", r.Size(), l.Held("a"), l.Stats().Held)
	}
	r.Release()
	if refusal := r.Grow(10); refusal != nil || l.Held("a") != 0 {
		t.Errorf("growth after Release: %v, caller holds %v; want it given back at once", refusal, l.Held("a"))
	}
	other.Release()
	if held := l.Stats().Held; held != 0 {
		t.Errorf("ledger holds %v after every release", held)
	}
}
