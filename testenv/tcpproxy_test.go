package testenv

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestProxyCutAndRestore: a client through the proxy is answered, then
// refused while the path is cut (its open connection dropped too), then
// answered again once it is restored, with the same client (its pooled
// connection was the one cut).
func TestProxyCutAndRestore(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	p := NewProxy(t, strings.TrimPrefix(srv.URL, "http://"))
	c := &http.Client{Timeout: 2 * time.Second}
	get := func() error {
		resp, err := c.Get("http://" + p.Addr() + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	if err := get(); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	p.Cut()
	if err := get(); err == nil {
		t.Fatal("answered through a cut path")
	}
	p.Restore()
	for i := 0; ; i++ {
		err := get()
		if err == nil {
			break
		}
		if i == 20 {
			t.Fatalf("not answered after the restore: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
