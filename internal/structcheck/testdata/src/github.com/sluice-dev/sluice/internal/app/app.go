package app // want `allowlist: entry "internal/app.Gone" names no function of this package`

import "context"

type App struct{}

// Serve is a listed lifecycle site: it carries no fact.
func (a *App) Serve(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { <-ctx.Done(); done <- nil }()
	return <-done
}

// Evasion: go f() hidden in a helper that a package with a lifecycle site
// exports.
func Spawn(f func()) { // want Spawn:"starts"
	go f() // want `goroutine: go statement in internal/app.Spawn starts a goroutine outside the listed lifecycle sites`
}

// Evasion: the same, one call further away.
func SpawnLater(f func()) { // want SpawnLater:"starts"
	Spawn(f) // want `goroutine: internal/app.Spawn starts a goroutine \(go statement in internal/app.Spawn\), and internal/app.SpawnLater is not a listed lifecycle site`
}

// Stale: listed as a lifecycle site, but starts nothing.
func Idle() {} // want `allowlist: entry "internal/app.Idle" allows goroutines but Idle starts none`
