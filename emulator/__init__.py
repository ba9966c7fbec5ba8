"""amlemu: a local emulator of Azure ML Compute (AmlCompute) clusters."""
