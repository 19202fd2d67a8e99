package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to target, and can
// cut the path: what a partition between a node and a server does, for a
// test that must drop one node's path to the API server and keep the rest.
type Proxy struct {
	target string
	ln     net.Listener
	addr   string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// NewProxy starts a proxy to target on a free loopback port; it stops
// when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return NewProxyIn(t, nil, target)
}

// NewProxyIn is NewProxy listening on the loopback of namespace ns (the
// host's when nil), so that a program run in ns reaches target, on the
// host's loopback, at 127.0.0.1 and the proxy's port: a node's path to
// the API server, which the test can cut.
func NewProxyIn(t testing.TB, ns *NetNS, target string) *Proxy {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}
	var err error
	if ns != nil {
		ns.Exec(t, "ip", "link", "set", "lo", "up")
		err = ns.Host.Do(listen)
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: target, ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.Cut() })
	return p
}

// Addr is host:port to dial instead of target.
func (p *Proxy) Addr() string { return p.addr }

// Cut drops every connection and refuses new ones (they are accepted and
// closed at once) until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[c], p.conns[u] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(u, c); done <- struct{}{} }()
	go func() { io.Copy(c, u); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}
