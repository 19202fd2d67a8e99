package pia

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// ClockError is a certificate of PIA's refused only because of the time:
// the node's clock is before its validity or after it. Homelab nodes
// without a real-time clock boot in the past until NTP steps the clock;
// until then every certificate is "not yet valid". That is no fault of
// the server's: it is not counted against it, does not back off, and is
// reported as what it is.
type ClockError struct {
	Now                 time.Time
	NotBefore, NotAfter time.Time
	// Unsynced: the kernel reports the clock unsynchronised (adjtimex's
	// STA_UNSYNC, what timedatectl shows as "System clock synchronized:
	// no").
	Unsynced bool
}

func (e *ClockError) Error() string {
	sync := ""
	if e.Unsynced {
		sync = "; the kernel reports it unsynchronised"
	}
	if e.Now.Before(e.NotBefore) {
		return fmt.Sprintf("the system clock is not synchronised: it reads %s, before PIA's certificates are valid (from %s)%s; waiting for the clock to be set",
			e.Now.UTC().Format(time.RFC3339), e.NotBefore.UTC().Format(time.RFC3339), sync)
	}
	return fmt.Sprintf("the system clock reads %s, after PIA's certificate expired (%s)%s: the clock or the certificate is wrong",
		e.Now.UTC().Format(time.RFC3339), e.NotAfter.UTC().Format(time.RFC3339), sync)
}

// clockErrorOf reports whether err is a certificate refused for its time
// alone, judged at now.
func clockErrorOf(err error, now time.Time) (*ClockError, bool) {
	var ce *ClockError
	if errors.As(err, &ce) {
		return ce, true
	}
	var cie x509.CertificateInvalidError
	if !errors.As(err, &cie) || cie.Reason != x509.Expired || cie.Cert == nil {
		return nil, false
	}
	return &ClockError{Now: now, NotBefore: cie.Cert.NotBefore, NotAfter: cie.Cert.NotAfter, Unsynced: kernelUnsynced()}, true
}

// kernelUnsynced reads the kernel's clock state (adjtimex, read only).
func kernelUnsynced() bool {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	return err == nil && (state == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0)
}

// stepThreshold is how far the wall clock may move from the monotonic
// clock between two steps of the provider before it counts as stepped.
const stepThreshold = 2 * time.Second

// clockStepped reports whether the wall clock (p.now) was stepped since
// the last call: it moved by more than stepThreshold unlike the monotonic
// clock.
func (p *Provider) clockStepped() (time.Duration, bool) {
	wall, mono := p.now().Round(0), time.Now()
	defer func() { p.lastWall, p.lastMono = wall, mono }()
	if p.lastWall.IsZero() {
		return 0, false
	}
	d := wall.Sub(p.lastWall) - mono.Sub(p.lastMono)
	return d, d > stepThreshold || d < -stepThreshold
}
