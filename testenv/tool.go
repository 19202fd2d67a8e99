package testenv

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// Tool is a testing.TB for the programs built on testenv outside a test
// (the PIA stub as a process, the demo): a failure panics with a *Failure
// that Run turns into a message and an exit status, cleanups run at
// Close. Methods it does not override are a nil TB's and panic; testenv
// and the stub do not call them.
type Tool struct {
	testing.TB
	name     string
	mu       sync.Mutex
	cleanups []func()
	// Out, when set, receives the Log, Logf, Error and Errorf lines (default: none).
	Out func(string)
}

// Failure is what a Tool's Fatal panics with.
type Failure struct{ Msg string }

func (f *Failure) Error() string { return f.Msg }

// NewTool returns a Tool named name. testing's flags are registered
// (testenv's guards ask testing.Short(), which needs them); after the
// program's own flag.Parse they keep their defaults.
func NewTool(name string) *Tool {
	testing.Init()
	return &Tool{name: name}
}

func (t *Tool) Helper()            {}
func (t *Tool) Name() string       { return t.name }
func (t *Tool) Failed() bool       { return false }
func (t *Tool) Skipped() bool      { return false }
func (t *Tool) Fail()              {}
func (t *Tool) Setenv(k, v string) { os.Setenv(k, v) }
func (t *Tool) TempDir() string {
	d, err := os.MkdirTemp("", t.name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (t *Tool) Cleanup(f func()) { t.mu.Lock(); t.cleanups = append(t.cleanups, f); t.mu.Unlock() }
func (t *Tool) Fatal(a ...any)   { panic(&Failure{fmt.Sprint(a...)}) }
func (t *Tool) Fatalf(f string, a ...any) {
	panic(&Failure{fmt.Sprintf(f, a...)})
}
func (t *Tool) FailNow()                  { panic(&Failure{"FailNow"}) }
func (t *Tool) Skip(a ...any)             { panic(&Failure{fmt.Sprint(a...)}) }
func (t *Tool) Skipf(f string, a ...any)  { panic(&Failure{fmt.Sprintf(f, a...)}) }
func (t *Tool) SkipNow()                  { panic(&Failure{"SkipNow"}) }
func (t *Tool) Log(a ...any)              { t.logf("%s", fmt.Sprint(a...)) }
func (t *Tool) Logf(f string, a ...any)   { t.logf(f, a...) }
func (t *Tool) Error(a ...any)            { t.logf("%s", fmt.Sprint(a...)) }
func (t *Tool) Errorf(f string, a ...any) { t.logf(f, a...) }

func (t *Tool) logf(f string, a ...any) {
	if t.Out != nil {
		t.Out(fmt.Sprintf(f, a...))
	}
}

// Close runs the cleanups, last first, once; a cleanup that fails (panics)
// does not stop the others.
func (t *Tool) Close() {
	t.mu.Lock()
	cs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		func() {
			defer func() { recover() }()
			cs[i]()
		}()
	}
}

// Run calls fn with the tool and closes it, also when fn fails: a Fatal
// becomes the returned error.
func (t *Tool) Run(fn func() error) (err error) {
	defer t.Close()
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(*Failure); ok {
				err = f
				return
			}
			panic(r)
		}
	}()
	return fn()
}
