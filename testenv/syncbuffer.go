package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer a process or a logger writes while a test
// reads it: the output of a daemon, a ping, a client.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
