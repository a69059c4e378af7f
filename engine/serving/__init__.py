"""The serving core: the step loop (schedule -> run -> postprocess), scheduler, sampler, async front."""
