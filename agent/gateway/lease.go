package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// leaseView is what the election knows of the Lease.
type leaseView struct {
	// leading: client-go's elector holds the Lease for us.
	leading bool
	// holder is the Lease's holder as last read ("" when free); prev the
	// last other node seen holding it (when this node takes the role, a
	// holder that died, or stopped without handing over, still has the
	// role's labels: they are this node's to clear).
	holder, prev string
	// readAt is when the Lease was last read or written; err the last
	// error talking to it.
	readAt time.Time
	err    error
	// takeBack is a preferred node's fresh request for the role.
	takeBack string
}

// notePrev remembers holder as the previous holder if it is another node.
func (v *leaseView) notePrev(holder, self string) {
	if holder != "" && holder != self {
		v.prev = holder
	}
}

// errFenced refuses an acquisition the wire forbids.
type errFenced struct{ why string }

func (e *errFenced) Error() string { return "not taking the Lease: " + e.why }

// fencedLock is client-go's LeaseLock, fenced on the wire: it refuses to
// write a record that makes this node the holder while another node is
// the holder on the wire (answers for the gateway address) or while the
// role says not to try (preferred node head start). A renewal, which
// keeps a holder that already is this node, is never fenced. The elector
// logs the refusal and tries again after its retry period.
type fencedLock struct {
	resourcelock.Interface
	fence func(ctx context.Context) error
	// expired reports whether a record read is another node's that has
	// not been renewed for its duration by the watch's clock; it is then
	// handed to the elector as free (see election.expired).
	expired func(rec *resourcelock.LeaderElectionRecord) bool
	// seen is called with each record read or written, and the holder it
	// replaced on an acquisition.
	seen func(rec *resourcelock.LeaderElectionRecord, prev string, err error)

	mu       sync.Mutex
	observed string // holder of the last record read
	read     bool
}

func (l *fencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	l.mu.Lock()
	if err == nil {
		l.observed, l.read = rec.HolderIdentity, true
	}
	l.mu.Unlock()
	l.seen(rec, "", err)
	if err == nil && l.expired != nil && l.expired(rec) {
		free := *rec
		free.HolderIdentity = ""
		if b, merr := json.Marshal(free); merr == nil {
			return &free, b, nil
		}
	}
	return rec, raw, err
}

// acquiring reports whether writing ler takes the Lease from another
// holder (or from none), and from whom.
func (l *fencedLock) acquiring(ler resourcelock.LeaderElectionRecord) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ler.HolderIdentity == "" || ler.HolderIdentity != l.Identity() {
		return false, "" // a release
	}
	return !l.read || l.observed != l.Identity(), l.observed
}

func (l *fencedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if err := l.fence(ctx); err != nil {
		l.seen(nil, "", err)
		return err
	}
	err := l.Interface.Create(ctx, ler)
	if err == nil {
		l.mu.Lock()
		l.observed, l.read = ler.HolderIdentity, true
		l.mu.Unlock()
	}
	l.seen(&ler, "", err)
	return err
}

func (l *fencedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	acq, prev := l.acquiring(ler)
	if acq {
		if err := l.fence(ctx); err != nil {
			l.seen(nil, "", err)
			return err
		}
	}
	err := l.Interface.Update(ctx, ler)
	if err == nil {
		l.mu.Lock()
		l.observed, l.read = ler.HolderIdentity, true
		l.mu.Unlock()
	}
	if !acq {
		prev = ""
	}
	l.seen(&ler, prev, err)
	return err
}

// election runs client-go's leader election for the role's Lease for as
// long as ctx lasts, one elector after another (an elector's Run ends when
// it loses the Lease), and watches the Lease so that a released one is
// tried at once rather than at the next retry. It reports what it sees
// through view.
type election struct {
	// client is the elector's; watcher the Lease watch's and the
	// take-back request's, apart, so that neither waits for the other in
	// its client's rate limiter.
	client   coordclient.LeasesGetter
	watcher  coordclient.LeasesGetter
	ns, name string
	identity string
	duration time.Duration
	renew    time.Duration
	retry    time.Duration
	fence    func(ctx context.Context) error
	log      *slog.Logger

	mu   sync.Mutex
	v    leaseView
	kick func() // the role's: the view changed
	// seenRenew is the holder's RenewTime the watch last saw, and
	// seenAt when (this node's clock) it saw it change: the watch sees
	// every renewal as it is written, so a holder that stopped renewing
	// is known to have stopped from seenAt on, not from when the
	// elector's own poll (one retry period, jittered, apart) noticed.
	seenHolder string
	seenRenew  time.Time
	seenAt     time.Time
	expiry     *time.Timer
	// attemptFrom is when this node first tried to take the Lease since a
	// holder last renewed it (the preferred node's head start).
	attemptFrom time.Time
	// restart ends the running elector (one that is not leading) so a
	// fresh one tries at once.
	restart context.CancelFunc
	// releasing: a hand-over ends the running elector, which gives up
	// the Lease; done is closed when run has returned.
	releasing bool
	done      chan struct{}
}

func (e *election) view() leaseView {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.v
}

func (e *election) update(f func(v *leaseView)) {
	e.mu.Lock()
	old := e.v
	f(&e.v)
	changed := old.leading != e.v.leading || old.holder != e.v.holder || (old.err == nil) != (e.v.err == nil) || old.takeBack != e.v.takeBack
	e.mu.Unlock()
	if changed && e.kick != nil {
		e.kick()
	}
}

func (e *election) seen(rec *resourcelock.LeaderElectionRecord, prev string, err error) {
	e.update(func(v *leaseView) {
		v.err = err
		var fenced *errFenced
		if errors.As(err, &fenced) {
			v.err = nil // the Lease answered; the wire said no
		}
		if rec != nil && err == nil {
			v.holder, v.readAt = rec.HolderIdentity, time.Now()
			v.notePrev(rec.HolderIdentity, e.identity)
			v.notePrev(prev, e.identity)
		}
	})
}

// run is the election's goroutine.
func (e *election) run(ctx context.Context) {
	defer close(e.done)
	go e.watch(ctx)
	for ctx.Err() == nil {
		ectx, cancel := context.WithCancel(ctx)
		e.mu.Lock()
		e.restart = cancel
		e.mu.Unlock()
		lock := &fencedLock{
			Interface: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: e.ns, Name: e.name},
				Client:     e.client,
				LockConfig: resourcelock.ResourceLockConfig{Identity: e.identity},
			},
			fence:   e.fence,
			seen:    e.seen,
			expired: e.expired,
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.duration,
			RenewDeadline:   e.renew,
			RetryPeriod:     e.retry,
			ReleaseOnCancel: true,
			Name:            e.name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { e.update(func(v *leaseView) { v.leading = true }) },
				OnStoppedLeading: func() { e.update(func(v *leaseView) { v.leading = false }) },
				OnNewLeader: func(id string) {
					e.update(func(v *leaseView) { v.holder = id; v.notePrev(id, e.identity) })
				},
			},
		})
		if err != nil {
			e.log.Error("gateway role: leader election", "err", err)
			cancel()
			return
		}
		le.Run(ectx)
		cancel()
		e.mu.Lock()
		releasing := e.releasing
		e.mu.Unlock()
		if releasing {
			e.update(func(v *leaseView) { v.leading, v.holder = false, "" })
			return
		}
	}
}

// yield gives up the Lease if this node holds it (client-go's release)
// and goes on as a candidate: the role's fence keeps the next elector
// from taking it straight back while the role yields (Role.yieldTo).
func (e *election) yield() {
	e.mu.Lock()
	stop := e.restart
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// handOver ends the election and gives up the Lease if this node holds
// it (client-go's release: holder empty, duration 1 s), so another
// candidate takes it at once. It returns when the elector has stopped, or
// when ctx ends.
func (e *election) handOver(ctx context.Context) {
	e.mu.Lock()
	e.releasing = true
	stop := e.restart
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	select {
	case <-e.done:
	case <-ctx.Done():
	}
}

// watch follows the Lease with a watch (its read-only twin of the
// elector's polling): a Lease released by its holder is tried at once by
// a fresh elector, and a take-back request from the preferred node is
// seen as soon as it is written.
func (e *election) watch(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		began := time.Now()
		w, err := e.watcher.Leases(e.ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", e.name).String()})
		if err == nil {
			e.follow(w)
			w.Stop()
		}
		if err == nil && time.Since(began) > time.Minute {
			backoff = time.Second // it ran: a server's timeout, not a fault
			continue
		}
		// It failed, or ended at once (an API server going away answers a
		// watch and closes it): wait, so that a broken path is not hammered
		// and the elector's requests are not held back behind these.
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// follow takes the watch's events until it ends.
func (e *election) follow(w watch.Interface) {
	for ev := range w.ResultChan() {
		if ev.Type != watch.Added && ev.Type != watch.Modified {
			continue
		}
		l, ok := ev.Object.(*coordinationv1.Lease)
		if !ok {
			continue
		}
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		tb := takeBackRequest(l, time.Now(), e.duration)
		e.update(func(v *leaseView) { v.takeBack = tb; v.notePrev(holder, e.identity) })
		e.sawRecord(l)
		e.mu.Lock()
		leading, restart, releasing := e.v.leading, e.restart, e.releasing
		e.mu.Unlock()
		if holder == "" && !leading && !releasing && restart != nil {
			// Released: a fresh elector's first try is at once, the
			// running one's only after its retry period.
			restart()
		}
	}
}

// sawRecord notes a record the watch saw. When another node holds the
// Lease, a fresh elector is started the moment its renewals have stopped
// for the Lease's duration: client-go's elector would notice only at its
// next poll after its own first sight of the last renewal, up to two
// jittered retry periods later, on top of the duration.
func (e *election) sawRecord(l *coordinationv1.Lease) {
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	var renew time.Time
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.Time
	}
	dur := e.duration
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if holder == e.seenHolder && renew.Equal(e.seenRenew) {
		return
	}
	e.seenHolder, e.seenRenew, e.seenAt = holder, renew, time.Now()
	if holder != "" {
		e.attemptFrom = time.Time{} // a holder renews: no free Lease to try
	}
	if e.expiry != nil {
		e.expiry.Stop()
		e.expiry = nil
	}
	if holder == "" || holder == e.identity {
		return
	}
	e.expiry = time.AfterFunc(dur+expiryMargin, func() {
		e.mu.Lock()
		restart, leading, releasing := e.restart, e.v.leading, e.releasing
		e.mu.Unlock()
		if !leading && !releasing && restart != nil {
			restart()
		}
	})
}

// expiryMargin is how long past the duration a Lease is taken as expired
// by the watch's clock: the watch's event reaches this node a moment after
// the renewal was written, so the holder's own view of its Lease ends a
// little before this node's.
const expiryMargin = 100 * time.Millisecond

// expired reports whether rec, as the elector just read it, is another
// node's Lease that the watch saw last renewed over its duration ago (the
// same record: the holder has not renewed since). The fenced lock then
// hands the elector the record as free, and the elector's update, which
// is conditional on the resourceVersion read, takes it unless the holder
// renewed in between.
func (e *election) expired(rec *resourcelock.LeaderElectionRecord) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rec.HolderIdentity == "" || rec.HolderIdentity == e.identity || rec.HolderIdentity != e.seenHolder || !rec.RenewTime.Time.Equal(e.seenRenew) {
		return false
	}
	dur := time.Duration(rec.LeaseDurationSeconds) * time.Second
	if dur <= 0 {
		dur = e.duration
	}
	return time.Since(e.seenAt) > dur+expiryMargin
}

// annotationTakeBack is the Lease annotation by which the preferred node
// asks for the role back: its name and the request's time (RFC 3339).
const annotationTakeBack = "nodeagent.io/take-back"

// takeBackRequest returns the node a fresh take-back request on l names,
// or "": one older than the Lease's duration is stale (its node may have
// gone again).
func takeBackRequest(l *coordinationv1.Lease, now time.Time, duration time.Duration) string {
	v := l.Annotations[annotationTakeBack]
	var node, at string
	if n, err := fmt.Sscanf(v, "%s %s", &node, &at); n != 2 || err != nil {
		return ""
	}
	t, err := time.Parse(time.RFC3339, at)
	if err != nil || now.Sub(t) > duration || t.Sub(now) > duration {
		return ""
	}
	return node
}

// headStart reports whether this node, not the preferred one, must still
// wait before it takes a free Lease: the preferred node gets one retry
// period's head start, so that it wins an election both take part in.
func (e *election) headStart(preferred string) bool {
	if preferred == "" || preferred == e.identity {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.attemptFrom.IsZero() {
		e.attemptFrom = time.Now()
	}
	return time.Since(e.attemptFrom) < e.retry
}

// askTakeBack writes the preferred node's take-back request on the Lease.
func (e *election) askTakeBack(ctx context.Context) error {
	l, err := e.watcher.Leases(e.ns).Get(ctx, e.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[annotationTakeBack] = e.identity + " " + time.Now().UTC().Format(time.RFC3339)
	_, err = e.watcher.Leases(e.ns).Update(ctx, l, metav1.UpdateOptions{})
	return err
}
