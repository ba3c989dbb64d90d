//go:build !unix

package journal

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDir opens dir/LOCK; without flock, two journals on one directory are
// not prevented on this platform.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open journal lock: %w", err)
	}
	return f, nil
}
