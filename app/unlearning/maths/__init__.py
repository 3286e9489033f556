"""The mathematics the families share: losses, step-size schedules, the domain projection, descent-to-delete's
constants and the work budget of a request."""
