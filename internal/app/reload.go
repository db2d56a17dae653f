package app

// ReloadAdmission re-reads the admission section of the config file at
// path and puts its budgets in force without restarting or dropping
// connections. On any error the budgets in force stay as they were.
func (a *App) ReloadAdmission(path string) error {
	cfg, err := LoadAdmission(path)
	if err != nil {
		return err
	}
	if err := a.Guard.SetBudgets(cfg); err != nil {
		return err
	}
	a.log.Info("admission budgets reloaded", "file", path, "default", cfg.Default.String(), "clients", len(cfg.Clients))
	return nil
}
