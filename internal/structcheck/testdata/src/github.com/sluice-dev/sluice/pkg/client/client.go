// Package client is client side: errgroups at listed sites only, with a
// real limit.
package client

import (
	"context"
	"math"

	"golang.org/x/sync/errgroup"
)

type Limits struct{ Parallelism int }

type Client struct {
	limits Limits
	max    int
}

func (c *Client) policy() int { return c.max }

// Allowed: limits from configuration, a parameter, a bounded constant.
func (c *Client) GetPostRecords(ctx context.Context, uris []string, n int) error { // want GetPostRecords:"limit\\[2\\]"
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.limits.Parallelism)
	h := new(errgroup.Group)
	h.SetLimit(min(n, 16))
	var k errgroup.Group
	k.SetLimit(len(uris))
	p := &errgroup.Group{}
	p.SetLimit(c.policy())
	for range uris {
		g.Go(func() error { return gctx.Err() })
		h.TryGo(func() error { return nil })
		k.Go(func() error { return nil })
		p.Go(func() error { return nil })
	}
	_ = h.Wait()
	_ = k.Wait()
	_ = p.Wait()
	return g.Wait()
}

const noLimit = -1

// Evasion: SetLimit(noLimit) with const noLimit = -1.
func NoLimit() {
	g := new(errgroup.Group)
	g.SetLimit(noLimit) // want `errgroup: SetLimit\(noLimit\) of errgroup g in pkg/client.NoLimit: the constant -1 is negative, which removes the limit`
	g.Go(func() error { return nil })
}

// Evasion: SetLimit(^0).
func Complement() {
	g := new(errgroup.Group)
	g.SetLimit(^0) // want `errgroup: SetLimit\(\^0\) of errgroup g in pkg/client.Complement: the constant -1 is negative`
	g.Go(func() error { return nil })
}

// Evasion: SetLimit(0-1).
func MinusOne() {
	g := new(errgroup.Group)
	g.SetLimit(0 - 1) // want `errgroup: SetLimit\(0 - 1\) of errgroup g in pkg/client.MinusOne: the constant -1 is negative`
	g.Go(func() error { return nil })
}

// Evasion: SetLimit(math.MaxInt).
func MaxInt() {
	g := new(errgroup.Group)
	g.SetLimit(math.MaxInt) // want `errgroup: SetLimit\(math.MaxInt\) of errgroup g in pkg/client.MaxInt: the constant 9223372036854775807 is over the ceiling of 1024`
	g.Go(func() error { return nil })
}

// A limit of zero runs nothing.
func Zero() {
	g := new(errgroup.Group)
	g.SetLimit(0) // want `errgroup: SetLimit\(0\) of errgroup g in pkg/client.Zero: a limit of 0 lets no task run`
	g.Go(func() error { return nil })
}

// Evasion: SetLimit under if false.
func IfFalse() {
	g := new(errgroup.Group) // want `errgroup: errgroup g in pkg/client.IfFalse has no limit: the statement right after its creation must be g.SetLimit\(n\)`
	if false {
		g.SetLimit(4) // want `errgroup: g.SetLimit in pkg/client.IfFalse: a group's limit is set once, on the statement right after its creation`
	}
	g.Go(func() error { return nil })
}

// Evasion: SetLimit after a return, where it never runs.
func Unreachable(ctx context.Context) {
	g, _ := errgroup.WithContext(ctx) // want `errgroup: errgroup g in pkg/client.Unreachable has no limit`
	g.Go(func() error { return nil })
	return
	g.SetLimit(4) // want `errgroup: g.SetLimit in pkg/client.Unreachable: a group's limit is set once`
}

// An errgroup never limited.
func Unset() {
	var g errgroup.Group // want `errgroup: errgroup g in pkg/client.Unset has no limit`
	g.Go(func() error { return nil })
}

// Evasion: a limit raised later.
func Raised() {
	g := new(errgroup.Group)
	g.SetLimit(2)
	g.SetLimit(-1) // want `errgroup: g.SetLimit in pkg/client.Raised: a group's limit is set once`
	g.Go(func() error { return nil })
}

// Evasion: a limit in a local variable.
func LocalLimit() {
	n := -1
	g := new(errgroup.Group)
	g.SetLimit(n) // want `errgroup: SetLimit\(n\) of errgroup g in pkg/client.LocalLimit: a limit is a constant from 1 to 1024 or comes from configuration`
	g.Go(func() error { return nil })
}

// Evasion: arithmetic on a configured limit.
func (c *Client) Arithmetic() {
	g := new(errgroup.Group)
	g.SetLimit(c.max - 2) // want `errgroup: SetLimit\(c.max - 2\) of errgroup g in pkg/client.\(\*Client\).Arithmetic: a limit is a constant`
	g.Go(func() error { return nil })
}

// Evasion: an errgroup held in a struct field.
type pool struct {
	g errgroup.Group // want `errgroup: errgroup.Group in a package-level declaration`
}

func (p *pool) Run() { // want `allowlist: entry "pkg/client.\(\*pool\).Run" is an errgroup site but Run creates no errgroup`
	p.g.SetLimit(4)                     // want `errgroup: errgroup g in pkg/client.\(\*pool\).Run was not created and limited here`
	p.g.Go(func() error { return nil }) // want `errgroup: errgroup g in pkg/client.\(\*pool\).Run was not created`
}

// Evasion: type G = errgroup.Group.
type G = errgroup.Group // want `errgroup: errgroup.Group in a package-level declaration`

func Aliased() {
	g := new(G) // want `errgroup: errgroup g in pkg/client.Aliased has no limit`
	g.Go(func() error { return nil })
}

// The alias in an unlisted function.
func AliasedUnlisted() { // want AliasedUnlisted:"starts"
	g := new(G)
	g.Go(func() error { return nil }) // want `errgroup: errgroup.\(\*Group\).Go in pkg/client.AliasedUnlisted` `goroutine: \(\*errgroup.Group\).Go in pkg/client.AliasedUnlisted`
}

// Evasion: a limited group handed to code that is not checked.
func Escapes(use func(*errgroup.Group)) {
	g := new(errgroup.Group)
	g.SetLimit(2)
	use(g) // want `errgroup: errgroup g in pkg/client.Escapes leaves its variable`
}

// Evasion: a group created outside a variable.
func Returned() *errgroup.Group {
	return new(errgroup.Group) // want `errgroup: errgroup created in pkg/client.Returned outside a local variable`
}

// Stale: listed as an errgroup site, but creates none.
func Plain() {} // want `allowlist: entry "pkg/client.Plain" is an errgroup site but Plain creates no errgroup`

// Evasion: a negative limit passed in through a parameter of the site.
func (c *Client) ThroughParam(ctx context.Context) error {
	return c.GetPostRecords(ctx, nil, noLimit) // want `errgroup: argument noLimit of pkg/client.\(\*Client\).GetPostRecords becomes an errgroup limit \(parameter n\): the constant -1 is negative`
}

// Evasion: the same, one caller further away.
func (c *Client) Relay(ctx context.Context, k int) error { // want Relay:"limit\\[1\\]"
	return c.GetPostRecords(ctx, nil, k)
}

func (c *Client) ThroughRelay(ctx context.Context) error {
	return c.Relay(ctx, math.MaxInt) // want `errgroup: argument math.MaxInt of pkg/client.\(\*Client\).Relay becomes an errgroup limit \(parameter k\): the constant 9223372036854775807 is over the ceiling`
}

// Allowed: a bounded constant for the parameter.
func (c *Client) Bounded(ctx context.Context) error { return c.GetPostRecords(ctx, nil, 8) }
