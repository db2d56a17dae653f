package cqlstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
	"github.com/sluice-dev/sluice/internal/synth"
)

// Tests that a batch read asks for its URIs in groups of read_group
// partitions, one SELECT each, and answers every stored URI and none of
// the others; and that read_group 1 sends one single-partition SELECT per
// URI.
func TestGetManyReadsInGroups(t *testing.T) {
	base := cqltest.Keyspace(t, "sluice_test_getmany")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	gen := synth.New(11, 40)
	recs := make([]store.Record, 45)
	uris := make([]string, 0, 2*len(recs))
	for i := range recs {
		recs[i] = gen.Next()
		uris = append(uris, recs[i].URI, recs[i].URI+"-never-stored")
	}
	for _, c := range []struct {
		group, selects int
		statement      string
	}{
		{20, 5, "WHERE uri IN ?"}, // 90 distinct URIs: 20 + 20 + 20 + 20 + 10
		{1, 90, "WHERE uri = ?"},
	} {
		t.Run(fmt.Sprintf("read_group %d", c.group), func(t *testing.T) {
			cfg := base
			cfg.ReadGroup = c.group
			obs := &cqltest.Observer{}
			cfg.QueryObserver = obs
			s, err := cqlstore.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Put(fanout.WithLimit(ctx, 8), recs); err != nil {
				t.Fatal(err)
			}
			obs.Reset()
			// 30 URIs twice: 120 asked, 90 distinct, so a group size of
			// 20 tells 6 SELECTs (duplicates read twice) from 5.
			got, err := s.GetMany(fanout.WithLimit(ctx, 4), append(uris, uris[:30]...))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(recs) {
				t.Errorf("GetMany answered %d records, want the %d stored", len(got), len(recs))
			}
			for _, r := range recs {
				if g, ok := got[r.URI]; !ok || string(g.JSON) != string(r.JSON) || g.CID != r.CID {
					t.Errorf("GetMany[%s] = %+v, %v; want the stored record", r.URI, g, ok)
				}
			}
			selects := 0
			for stmt, n := range obs.Statements() {
				if !strings.HasPrefix(stmt, "SELECT") {
					continue
				}
				if !strings.Contains(stmt, c.statement) {
					t.Errorf("statement %q, want one %q", stmt, c.statement)
				}
				selects += n
			}
			if selects != c.selects {
				t.Errorf("%d SELECTs for %d distinct URIs, want %d: %v", selects, len(uris), c.selects, obs.Statements())
			}
		})
	}
}

// Tests that read_group is refused outside [1, 100] with a message
// naming the limit.
func TestReadGroupBounds(t *testing.T) {
	for _, g := range []int{0, cqlstore.MaxReadGroup + 1} {
		c := cqlstore.DefaultConfig()
		c.Hosts = []string{"127.0.0.1"}
		c.ReadGroup = g
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("read group %d is outside [1, %d]", g, cqlstore.MaxReadGroup)) {
			t.Errorf("Validate with read group %d: %v", g, err)
		}
	}
}
