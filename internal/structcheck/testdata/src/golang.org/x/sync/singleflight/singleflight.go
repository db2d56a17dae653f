// Package singleflight is a stub of golang.org/x/sync/singleflight.
package singleflight

type Result struct{}

type Group struct{}

func (g *Group) Do(key string, fn func() (any, error)) (any, error, bool) {
	v, err := fn()
	return v, err, false
}

func (g *Group) DoChan(key string, fn func() (any, error)) <-chan Result { return nil }
