"""Operations: metrics, the deployment's figures, probes, operations endpoints, diagnostics, event logs."""
