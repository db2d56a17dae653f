// Package posts is a read-path package: strict.
package posts

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/guard/queue"
)

func GoStatement() { // want GoStatement:"starts"
	go func() {}() // want `goroutine: go statement in internal/posts.GoStatement`
}

// Evasion: time.AfterFunc.
func TimeAfterFunc() { // want TimeAfterFunc:"starts"
	time.AfterFunc(time.Second, func() {}) // want `goroutine: time.AfterFunc in internal/posts.TimeAfterFunc`
}

// Evasion: time.AfterFunc as a function value.
func TimeAfterFuncValue() { // want TimeAfterFuncValue:"starts"
	later := time.AfterFunc // want `goroutine: time.AfterFunc in internal/posts.TimeAfterFuncValue`
	later(time.Second, func() {})
}

// Evasion: context.AfterFunc.
func ContextAfterFunc(ctx context.Context) { // want ContextAfterFunc:"starts"
	context.AfterFunc(ctx, func() {}) // want `goroutine: context.AfterFunc in internal/posts.ContextAfterFunc`
}

// Evasion: sync.WaitGroup.Go (Go 1.25+).
func WaitGroupGo() { // want WaitGroupGo:"starts"
	var wg sync.WaitGroup
	wg.Go(func() {}) // want `goroutine: \(\*sync.WaitGroup\).Go in internal/posts.WaitGroupGo`
	wg.Wait()
}

// Evasion: singleflight's DoChan runs the function in a new goroutine.
func DoChan(g *singleflight.Group) { // want DoChan:"starts"
	<-g.DoChan("k", func() (any, error) { return nil, nil }) // want `goroutine: \(\*singleflight.Group\).DoChan`
}

// Evasion: a helper of a package with a lifecycle site, and of the guard.
func Laundered() { // want Laundered:"starts"
	app.Spawn(func() {})        // want `goroutine: internal/app.Spawn starts a goroutine \(go statement in internal/app.Spawn\)`
	app.SpawnLater(func() {})   // want `goroutine: internal/app.SpawnLater starts a goroutine \(go statement in internal/app.Spawn\)`
	guard.Background(func() {}) // want `goroutine: internal/guard.Background starts a goroutine`
}

// Evasion: a spawner called from outside its own package.
func Spawner() { // want Spawner:"starts"
	queue.SystemClock{}.AfterFunc(time.Second, func() {}) // want `goroutine: internal/guard/queue.SystemClock.AfterFunc starts a goroutine \(time.AfterFunc in internal/guard/queue.SystemClock.AfterFunc\)`
}

// Evasion: errgroup.Go in a read-path package, limit or not.
func ReadPathErrgroup(ctx context.Context) error { // want ReadPathErrgroup:"starts"
	g, ctx := errgroup.WithContext(ctx)     // want `errgroup: errgroup.WithContext in internal/posts.ReadPathErrgroup: errgroups exist only at listed fan-out sites`
	g.SetLimit(4)                           // want `errgroup: errgroup.\(\*Group\).SetLimit`
	g.Go(func() error { return ctx.Err() }) // want `errgroup: errgroup.\(\*Group\).Go` `goroutine: \(\*errgroup.Group\).Go in internal/posts.ReadPathErrgroup`
	return g.Wait()                         // want `errgroup: errgroup.\(\*Group\).Wait`
}

// Allowed: parallel work through the fan-out, and the sanctioned
// registration path.
func Parallel(ctx context.Context, s *guard.Server) error {
	s.Register(nil, nil)
	return fanout.Each(ctx, 3, func(ctx context.Context, i int) error { return nil })
}

// Evasion: a package-level function value hiding a go statement.
var spawn = func(f func()) { go f() } // want `goroutine: go statement in a package-level declaration`
