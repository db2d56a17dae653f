// Evasion: a new package outside internal/ and pkg/ is strict too.
package spawn

func Start(f func()) { // want Start:"starts"
	go f() // want `goroutine: go statement in newtop/spawn.Start`
}
