"""Iterative (diffusion) models: the sampler loop the runtime owns, prompts, images, reuse."""
