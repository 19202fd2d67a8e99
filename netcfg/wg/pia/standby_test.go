package pia

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestStandbyKeepsTokenAndListFresh: a provider standing by for a gateway
// role another node holds asks PIA for the token and the server list
// only, each on its own period, over two days; taken off standby, it
// registers at once, with the token and list it kept (one addKey, no
// token or list fetched for it); put back on standby, it gives the
// registration up.
func TestStandbyKeepsTokenAndListFresh(t *testing.T) {
	var r *rig
	r = newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/token":
			fmt.Fprint(w, `{"token":"s3cr3t-t0ken"}`)
		case "/list":
			w.Write([]byte(signListLine(r.listKey, testList)))
		case "/addKey":
			w.Write(addKeyAnswer(r.key.PublicKey(), nil))
		}
	})
	if !r.p.SetStandby(true) {
		t.Fatal("SetStandby(true) changed nothing")
	}
	end := r.clk.Now().Add(48 * time.Hour)
	for ; r.clk.Now().Before(end); r.clk.Add(time.Minute) {
		r.step(Observation{}, 3)
		if s := r.p.Status(); s.Phase != PhaseStandby || s.Healthy {
			t.Fatalf("on standby at %s: %+v", r.clk.Now(), s)
		}
	}
	tokens, lists, adds := r.hits.count("/token"), r.hits.count("/list"), r.hits.count("/addKey")
	t.Logf("standing by for 48h: %d token requests, %d list fetches, %d addKey", tokens, lists, adds)
	if adds != 0 || r.p.Registration() != nil {
		t.Errorf("%d addKey requests on standby (registration %v); want none", adds, r.p.Registration())
	}
	// A token at once (none is saved) and then every TokenRefresh; the
	// list (the rig's is fresh) every ListRefresh.
	if want := int(48*time.Hour/r.p.t.TokenRefresh) + 1; tokens != want {
		t.Errorf("%d token requests in 48h, want %d (one at once, then every %s)", tokens, want, r.p.t.TokenRefresh)
	}
	if want := int(48*time.Hour/r.p.t.ListRefresh) - 1; lists != want {
		t.Errorf("%d list fetches in 48h, want %d (every %s)", lists, want, r.p.t.ListRefresh)
	}

	// The role comes to this node: one registration, nothing fetched
	// again for it.
	r.p.SetStandby(false)
	before := len(r.hits.all())
	for range 3 {
		r.step(Observation{}, 5)
		r.clk.Add(time.Second)
	}
	if r.p.Registration() == nil {
		t.Fatalf("not registered 3 s after leaving standby: %+v", r.p.Status())
	}
	if got := r.hits.all()[before:]; len(got) != 1 || r.hits.count("/addKey") != 1 {
		t.Errorf("taking the role made %d requests (addKey %d); want the one addKey", len(got), r.hits.count("/addKey"))
	}

	// And goes again.
	r.p.SetStandby(true)
	if r.p.Registration() != nil || r.p.Port() != 0 {
		t.Errorf("back on standby: registration %v, port %d; want neither", r.p.Registration(), r.p.Port())
	}
}
