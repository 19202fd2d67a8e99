package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// The daemon's garbage collector lets the heap grow by daemonGCPercent of
// what was live after the last collection, but by no more than
// gcHeadroom, and by no less than minGCPercent of it.
//
// A percentage alone prices headroom by the live heap, which an embedded
// (userspace) WireGuard device makes large: wireguard-go keeps about
// 33 KiB of heap per peer, mostly queues, so with 5000 peers the live heap
// is some 185 MiB, of which the daemon's own is about 20. Half of that is
// 90 MiB of headroom that the daemon's own garbage (each resync's reads)
// fills and keeps resident. Capping the headroom keeps it at gcHeadroom,
// for a collection every few resyncs (each reads the device in process,
// about 2 MB of garbage for 5000 peers); with the kernel's WireGuard (a live
// heap of about 25 MiB) the cap is never reached and the target stays at
// daemonGCPercent.
const (
	gcHeadroom   = 24 << 20
	minGCPercent = 10
)

// tuneGC sets the collector's target after every collection from the heap
// it left live, until the process exits. Its cost is a finalizer run per
// collection.
func tuneGC() {
	t := &gcTuner{percent: daemonGCPercent}
	t.sample = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t.arm()
}

type gcTuner struct {
	percent int
	sample  []metrics.Sample
}

// arm sets a finalizer on a new object no one refers to, so it runs after
// the next collection.
func (t *gcTuner) arm() {
	runtime.SetFinalizer(&gcSentinel{t: t}, func(s *gcSentinel) { s.t.after() })
}

// gcSentinel holds a pointer, so it is never one of the tiny allocations
// that share a block (and a finalizer's fate) with others.
type gcSentinel struct{ t *gcTuner }

func (t *gcTuner) after() {
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		if p := gcPercentFor(t.sample[0].Value.Uint64()); p != t.percent {
			t.percent = p
			debug.SetGCPercent(p)
		}
	}
	t.arm()
}

// gcPercentFor is the target that lets a heap of live bytes grow by
// daemonGCPercent of it, at most gcHeadroom, at least minGCPercent.
func gcPercentFor(live uint64) int {
	if live == 0 {
		return daemonGCPercent
	}
	p := int(uint64(gcHeadroom) * 100 / live)
	return max(minGCPercent, min(daemonGCPercent, p))
}
