"""Pure decision logic (sans-I/O): plan schema, window state machine, rules, interpretation."""
