package app

import "fmt"

// ReloadAdmission puts in force the admission budgets of next, a config
// assembled from the file at path as start-up assembles one (defaults,
// the file, then flags), without restarting or dropping connections. A
// config start-up would refuse changes nothing, even when its budgets
// are valid: the file is taken whole or not at all.
func (a *App) ReloadAdmission(next Config, path string) error {
	if err := next.Validate(); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	cfg := next.Guard.Admission
	if err := a.Guard.SetBudgets(cfg); err != nil {
		return err
	}
	a.log.Info("admission budgets reloaded", "file", path, "default", cfg.Default.String(), "clients", len(cfg.Clients))
	return nil
}
