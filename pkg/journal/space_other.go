//go:build !unix

package journal

import "errors"

// freeBytes is not known here: the cap is MaxBytes alone.
func freeBytes(string) (int64, error) { return 0, errors.New("free space not known on this platform") }
