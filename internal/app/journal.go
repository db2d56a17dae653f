package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/sluice-dev/sluice/internal/journal"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
)

// catchUpTimeout bounds the journal replay a starting server makes
// before it serves; servers it did not catch up stay distrusted.
const catchUpTimeout = 10 * time.Second

// newOrigin names this process in the journal: host, pid and a random
// suffix, so a restarted process never takes its predecessor's changes
// for its own.
func newOrigin() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// followerConfig fills the start-up replay: the cache's longest entry
// lifetime, since older changes cannot have left a live stale entry,
// and never more than the journal keeps.
func (a *App) followerConfig(j store.Journal) journal.Config {
	cfg := a.cfg.Journal.WithDefaults()
	if cfg.StartReplay == 0 {
		cfg.StartReplay = a.cfg.longestEntry() + a.cfg.Cache.TombstoneTTL
	}
	cfg.StartReplay = min(cfg.StartReplay, j.Retention()-journal.ReplayMargin)
	return cfg
}

// catchUp replays the journal onto every memcached server before the
// server serves.
func (a *App) catchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	start := time.Now()
	a.Follower.CatchUp(ctx)
	s := a.Follower.Stats()
	a.log.Info("journal replayed onto memcached before serving", "component", "journal",
		"tombstones", s.ReplayedURIs, "distrusted", s.Suspects, "took", time.Since(start).Round(time.Millisecond))
}

// journalSize counts the embedded store's journal entries.
func (a *App) journalSize() (int64, bool) {
	b, ok := a.rawStore.(*boltstore.Store)
	if !ok {
		return 0, false
	}
	n, err := b.JournalLen()
	return int64(n), err == nil
}

// afterStoreWrite passes the config's test hook to the write path.
func (a *App) afterStoreWrite() posts.Option {
	if a.cfg.AfterStoreWrite == nil {
		return posts.WithAfterStoreWrite(func([]string) {})
	}
	return posts.WithAfterStoreWrite(a.cfg.AfterStoreWrite)
}
