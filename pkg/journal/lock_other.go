//go:build !unix

package journal

import "os"

// lockFile does nothing: without flock, two journals on one directory are not
// prevented on this platform.
func lockFile(*os.File) error { return nil }
