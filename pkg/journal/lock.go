package journal

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDir opens dir/LOCK and locks it (lockFile) so that two journals never
// append to the same segments. Closing the file releases the lock.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open journal lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}
