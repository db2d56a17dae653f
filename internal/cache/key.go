package cache

import (
	"crypto/sha256"
	"encoding/base64"
	"hash/fnv"
)

// keyPrefix versions the key and value format. Change it when the meaning
// of stored items changes; old items then simply stop being read.
const keyPrefix = "sl1:"

// Key returns the memcached key for uri: a versioned prefix and the
// unpadded URL-safe base64 of the URI's SHA-256, 47 bytes in all.
//
// Hashing makes every key legal whatever the URI holds (spaces, CR LF,
// control bytes, invalid UTF-8, any length), so no URI can form a
// malformed key or smuggle a command into the text protocol.
func Key(uri string) string {
	sum := sha256.Sum256([]byte(uri))
	var buf [len(keyPrefix) + 43]byte // 43: unpadded base64 of 32 bytes
	b := append(buf[:0], keyPrefix...)
	return string(base64.RawURLEncoding.AppendEncode(b, sum[:]))
}

// pick returns the index of the server that owns key by rendezvous
// (highest random weight) hashing: each server scores the key and the
// highest score wins. Adding or removing one of n servers moves only about
// 1/n of the keys. seeds holds one hash per server address.
func pick(seeds []uint64, key string) int {
	if len(seeds) == 1 {
		return 0
	}
	kh := fnv64a(key)
	best, bestScore := 0, uint64(0)
	for i, seed := range seeds {
		if score := mix64(seed ^ kh); i == 0 || score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// pickLive is pick among the servers live reports true for: a key whose
// server is out goes to its next-highest scorer, and returns to its own
// server when that is back, so only the out server's keys move. With no
// live server it is pick.
func pickLive(seeds []uint64, key string, live func(i int) bool) int {
	if len(seeds) == 1 {
		return 0
	}
	kh := fnv64a(key)
	best, bestScore, found := pick(seeds, key), uint64(0), false
	for i, seed := range seeds {
		if !live(i) {
			continue
		}
		if score := mix64(seed ^ kh); !found || score > bestScore {
			best, bestScore, found = i, score, true
		}
	}
	return best
}

// seedsFor hashes each server address for pick.
func seedsFor(servers []string) []uint64 {
	seeds := make([]uint64, len(servers))
	for i, s := range servers {
		seeds[i] = fnv64a(s)
	}
	return seeds
}

func fnv64a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// mix64 is the MurmurHash3 64-bit finalizer; it spreads the small
// differences FNV leaves between similar inputs over all bits.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
