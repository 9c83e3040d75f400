//! pDPM-Central in the simulator.
