package kube

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// TestResponseBodiesAreCapped: an API server (or something posing as one)
// that answers a Node GET with more than MaxResponseBytes is refused, with
// or without a Content-Length, and an ordinary Node still reads. The
// server here is a stand-in: it plays a misbehaving API server, which a
// real kube-apiserver cannot be made to be.
func TestResponseBodiesAreCapped(t *testing.T) {
	node := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","annotations":{"pad":"%s"}}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/nodes/small":
			fmt.Fprintf(w, node, "x")
		case "/api/v1/nodes/big":
			body := fmt.Sprintf(node, strings.Repeat("x", MaxResponseBytes+1))
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write([]byte(body))
		case "/api/v1/nodes/chunked":
			w.Header().Set("Transfer-Encoding", "chunked")
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, node, strings.Repeat("y", MaxResponseBytes+1))
		}
	}))
	defer srv.Close()
	c, err := newClient(Config{RESTConfig: &rest.Config{Host: srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n, err := c.GetNode(ctx, "small"); err != nil || n.Name != "n1" {
		t.Fatalf("an ordinary Node: %v", err)
	}
	for _, name := range []string{"big", "chunked"} {
		_, err := c.GetNode(ctx, name)
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("a %s response over %d bytes: %v; want it refused", name, MaxResponseBytes, err)
		}
	}
}
