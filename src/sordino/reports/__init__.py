"""reports: diagnose (HTML and PDF with charts); later postmortem and stress-test reports."""
