// Package testenv is test support: goroutines are free here.
package testenv

func Background(f func()) { // want Background:"starts"
	go f()
}
