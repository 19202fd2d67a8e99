// Package clientqr shows a client's wg-quick config as a QR code, which
// the WireGuard apps scan to import it: in a terminal, and as a PNG. The
// code itself is made by github.com/piglig/go-qr (a port of Project
// Nayuki's QR Code generator); this package only draws its modules.
package clientqr

import (
	"fmt"
	"io"
	"strings"

	goqr "github.com/piglig/go-qr"
)

// encode makes the QR code of text at error correction level M, which a
// phone's camera reads off a screen reliably, at the smallest version
// that holds it (a config of two addresses fits in version 10 or so).
func encode(text string) (*goqr.QrCode, error) {
	q, err := goqr.EncodeText(text, goqr.Medium)
	if err != nil {
		return nil, fmt.Errorf("QR code: %w", err)
	}
	return q, nil
}

// border is the quiet zone around the code, in modules, as the standard
// asks (4).
const border = 4

// PNG writes text's QR code as a PNG, scale pixels per module.
func PNG(w io.Writer, text string, scale int) error {
	q, err := encode(text)
	if err != nil {
		return err
	}
	return q.WriteAsPNG(goqr.NewQrCodeImgConfig(scale, border), w)
}

// Terminal writes text's QR code for a terminal: two rows of modules per
// line in half blocks, drawn light-on-dark with the colours forced (ANSI
// white on black), so it scans the same on a light or a dark terminal, as
// qrencode -t ansiutf8 draws it.
func Terminal(w io.Writer, text string) error {
	q, err := encode(text)
	if err != nil {
		return err
	}
	n := q.Size()
	light := func(x, y int) bool {
		if x < 0 || y < 0 || x >= n || y >= n {
			return true // the quiet zone
		}
		return !q.Module(x, y)
	}
	var b strings.Builder
	for y := -border; y < n+border; y += 2 {
		b.WriteString("\x1b[40;37m")
		for x := -border; x < n+border; x++ {
			top, bottom := light(x, y), y+1 < n+border && light(x, y+1)
			switch {
			case top && bottom:
				b.WriteString("█")
			case top:
				b.WriteString("▀")
			case bottom:
				b.WriteString("▄")
			default:
				b.WriteString(" ")
			}
		}
		b.WriteString("\x1b[0m\n")
	}
	_, err = io.WriteString(w, b.String())
	return err
}
